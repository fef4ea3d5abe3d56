"""The sharded trainer on CPU: what one rank holds, and what a step and a publish cost, at world
size 1 and 2 (`LOOM_TRAINER_WORLD_SIZE`), next to today's one-process trainer in the same run.

A random-init Qwen2-shaped model ("100mb": 25M parameters, fp32) built locally, full
fine-tuning, cross-entropy on rows of equal length, each rank one torch thread:
- per rank: bytes of weights + gradients + AdamW moments it holds (its FSDP shards; exact
  tensor sizes, read from the rank), its peak RSS (VmHWM) once the model is loaded (rank 0
  reads the weights, the others build the model on the meta device and receive their
  shards) and over the run;
- step time: forward_backward + optim_step, median of the timed steps;
- publish: save_weights' files (64 MB shards, one file gathered at a time, the files going
  round the ranks): time, and each rank's peak RSS during it over its RSS before.

Writes the first section of bench/results/trainer_scale.md (the sections after it stay).

    python -m bench.trainer_scale [--size 100mb] [--rows 8] [--tokens 128] [--steps 3]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from services.common.tiny_model import MODEL_SIZES, build_random_model
from services.trainer.distributed.commands import RankConfig
from services.trainer.distributed.ranks import RankGroup
from services.trainer.distributed.remote import RemoteModel, RemoteRegistry
from services.trainer.distributed.sharding import Sharding
from services.trainer.model import TrainerModel
from services.trainer.registry import ModelRegistry
from services.trainer.schemas import AdamParams, CreateModelRequest, Datum, LossConfig, TrainingMode

RESULTS = Path(__file__).parent / "results" / "trainer_scale.md"
MB = 1 << 20


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS


def _data(rows: int, tokens: int) -> list[Datum]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 200, (rows, tokens), generator=generator).tolist()
    return [Datum(input_ids=row, loss_mask=[0.0] * 4 + [1.0] * (tokens - 4)) for row in ids]


def _steps(model: TrainerModel | RemoteModel, data: list[Datum], steps: int) -> float:
    """Median seconds of a step, after one untimed step; then one more forward_backward, so
    the gradients are held (as at a step's peak) when the caller reads what is held."""
    times = []
    for i in range(steps + 1):
        start = time.perf_counter()
        model.forward_backward(data, LossConfig())
        model.optim_step(AdamParams(lr=1e-5))
        if i:
            times.append(time.perf_counter() - start)
    model.forward_backward(data, LossConfig())
    return statistics.median(times)


def one_process(
    spec: CreateModelRequest, data: list[Datum], steps: int, work: Path
) -> dict[str, Any]:
    registry = ModelRegistry(work / "one", torch.device("cpu"), micro_batch_tokens=1 << 20)
    model, _ = registry.create(spec)
    step = _steps(model, data, steps)
    held = model.state_bytes()
    (work / "one-save").mkdir()
    start = time.perf_counter()
    model.save(work / "one-save", 64 * MB)
    return {
        "arm": "one process (world size 1, today's path)",
        "step_s": step,
        "held": held,
        "publish_s": time.perf_counter() - start,
        "ranks": [],
    }


def sharded(
    world_size: int, spec: CreateModelRequest, data: list[Datum], steps: int, work: Path
) -> dict[str, Any]:
    group = RankGroup(
        RankConfig(
            world_size=world_size,
            master_port=0,
            data_dir=work / f"ranks-{world_size}",
            device="cpu",
            micro_batch_tokens=1 << 20,
            threads=1,
            sharding=Sharding(),
            timeout_s=600,
        )
    )
    group.start()
    try:
        model, _ = RemoteRegistry(group).create(spec)
        load_peak = [_status_kb(pid, "VmHWM") for pid in group.pids]
        step = _steps(model, data, steps)
        held = group.call("call", spec.job_id, "state_bytes", ())
        train_peak = [_status_kb(pid, "VmHWM") for pid in group.pids]
        before = [_status_kb(pid, "VmRSS") for pid in group.pids]
        for pid in group.pids:
            _reset_peak(pid)
        directory = work / f"save-{world_size}"
        directory.mkdir()
        start = time.perf_counter()
        model.save(directory, 64 * MB)
        publish = time.perf_counter() - start
        publish_peak = [_status_kb(pid, "VmHWM") for pid in group.pids]
    finally:
        group.stop()
    ranks = [
        {"load_peak_mb": load / 1024, "train_peak_mb": t / 1024, "publish_extra_mb": (p - b) / 1024}
        for load, t, b, p in zip(load_peak, train_peak, before, publish_peak, strict=True)
    ]
    return {
        "arm": f"{world_size} rank{'s' if world_size > 1 else ''} (FSDP2, gloo)",
        "step_s": step,
        "held": held,
        "publish_s": publish,
        "ranks": ranks,
    }


def report(
    rows: list[dict[str, Any]], args: argparse.Namespace, params: int, file_mb: float
) -> str:
    trained = ("weights", "gradients", "optimizer")
    one = sum(rows[0]["held"][part] for part in trained)
    lines = [
        "# Sharded trainer on CPU (bench/trainer_scale.py)",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()},"
        f" {torch.get_num_threads()} torch threads here, 1 per rank; torch {torch.__version__}."
        f" Model: random-init Qwen2 '{args.size}', {params / 1e6:.1f}M parameters (fp32), "
        f"{file_mb:.0f} MB of weight files. Batch: {args.rows} rows x {args.tokens} tokens, "
        f"cross-entropy, full fine-tuning, {args.steps} timed steps (median). The machine has "
        "2 cores shared with other work: times are noisy, memory is not.",
        "",
        "| arm | weights+grads+AdamW held per rank (MB) | vs one process | step (s) | "
        "publish (s) | per-rank peak RSS, loaded (MB) | per-rank peak RSS, run (MB) | "
        "per-rank publish peak over RSS before (MB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        held = sum(row["held"][part] for part in trained)
        ranks = row["ranks"]
        lines.append(
            f"| {row['arm']} | {held / MB:.1f} ({row['held']['weights'] / MB:.1f} + "
            f"{row['held']['gradients'] / MB:.1f} + {row['held']['optimizer'] / MB:.1f}) | "
            f"{held / one:.2f}x | {row['step_s']:.2f} | {row['publish_s']:.2f} | "
            + (", ".join(f"{r['load_peak_mb']:.0f}" for r in ranks) or "-")
            + " | "
            + (", ".join(f"{r['train_peak_mb']:.0f}" for r in ranks) or "-")
            + " | "
            + (", ".join(f"{r['publish_extra_mb']:.0f}" for r in ranks) or "-")
            + " |"
        )
    lines += [
        "",
        "Held bytes are the tensors' own sizes on rank 0 after a forward_backward "
        "(FSDP2 splits every parameter's first dimension; rank 1 holds the same to "
        "within one row per tensor). Peak RSS includes torch, transformers and the gloo "
        "buffers of a rank; rank 0 reads the whole model from disk before it hands each "
        "rank its shards, the other ranks never hold it whole. A "
        "publish gathers one file at a time (at most 64 MB of whole tensors here); its "
        "peak over the RSS before it is small because the allocator reuses the memory "
        "the step's activations freed.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="100mb", choices=sorted(MODEL_SIZES))
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        base = build_random_model(work / "model", MODEL_SIZES[args.size])
        file_mb = sum(p.stat().st_size for p in base.glob("*.safetensors")) / MB
        spec = CreateModelRequest(job_id="scale", base_model=str(base), mode=TrainingMode.full)
        data = _data(args.rows, args.tokens)
        rows = [one_process(spec, data, args.steps, work)]
        rows += [sharded(n, spec, data, args.steps, work) for n in (1, 2)]
        params = rows[0]["held"]["weights"] // 4  # fp32
        text = report(rows, args, params, file_mb)
    previous = RESULTS.read_text() if RESULTS.exists() else ""
    later = previous.find("\n## ")  # sections written by hand after this one
    RESULTS.write_text(text + (previous[later:] if later >= 0 else ""))
    print(text)


if __name__ == "__main__":
    main()
