"""Peak memory of forward_backward is one micro-batch's, whatever the batch's size: each
micro-batch is back-propagated and its graph freed before the next runs. Measured as the peak
RSS of a fresh process (the tiny model on CPU), against the one-graph way as a control that
shows the measure can tell them apart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROW_TOKENS = 128
BUDGET = 16 * ROW_TOKENS  # one micro-batch: 16 rows

MEASURE = """
import json, sys
from pathlib import Path
import torch
from services.trainer.registry import ModelRegistry
from services.trainer.schemas import CreateModelRequest, Datum, LossConfig, LossName
model_dir, data_dir, budget, batches, n = sys.argv[1:3] + [int(sys.argv[3]), sys.argv[4],
                                                          int(sys.argv[5])]
torch.set_num_threads(1)
registry = ModelRegistry(Path(data_dir), torch.device("cpu"), budget)
model, _ = registry.create(CreateModelRequest(job_id="j1", base_model=model_dir, mode="full"))
config = LossConfig(name=LossName.importance_sampling)
def batch(rows):
    return [Datum(input_ids=[(7 * r + i) % 200 + 3 for i in range(n)],
                  loss_mask=[0.0] * 4 + [1.0] * (n - 4), logprobs=[-5.0] * n,
                  advantages=[0.5 - (r % 2)] * n) for r in range(rows)]
peaks = []
for rows in map(int, batches.split(",")):
    model.forward_backward(batch(rows), config)
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the forked parent (the
    # test runner, over a GB in a full run), while VmHWM is this process's own.
    status = Path("/proc/self/status").read_text()
    hwm = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    peaks.append(int(hwm.split()[1]) / 1024)
print(json.dumps(peaks))
"""


def peak_rss_mb(model_dir: Path, data_dir: Path, budget: int, rows: list[int]) -> list[float]:
    """The process's peak RSS (MiB) after each forward_backward of `rows` rows, in order."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            MEASURE,
            str(model_dir),
            str(data_dir),
            str(budget),
            ",".join(map(str, rows)),
            str(ROW_TOKENS),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parents[3],
    )
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.slow  # two subprocesses training 128-row batches
def test_peak_memory_is_one_micro_batchs_whatever_the_batch(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # The first calls settle what stays (gradients, the allocator's arenas): 16 rows twice.
    _, one, eight = peak_rss_mb(tiny_model_dir, tmp_path / "a", BUDGET, [16, 16, 128])
    # Control: the same 8x batch as one graph (a budget that holds all of it) needs far more,
    # so the measure above would have seen it.
    _, _, one_graph = peak_rss_mb(tiny_model_dir, tmp_path / "b", 128 * ROW_TOKENS, [16, 16, 128])
    assert eight <= one * 1.10, (one, eight)
    assert one_graph - one > 4 * (eight - one) + 50, (one, eight, one_graph)
