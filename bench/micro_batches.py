"""Trainer micro-batches by length: one forward_backward on a long-tailed RL batch, as one
padded pass (every row padded to the longest) against micro-batches of rows of similar length
(`LOOM_TRAINER_MICRO_BATCH_TOKENS`), interleaved round by round on the same data, the same
model (tiny, full weights, one torch thread, CPU) and the same loss (PPO, token mean). Writes
bench/results/micro_batches.md.

    .venv/bin/python -m bench.micro_batches [--rows 32] [--mean-tokens 48] [--max-tokens 256]
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from services.common.base_models import ensure_tiny_model
from services.trainer.batch import micro_batches
from services.trainer.model import TrainerModel
from services.trainer.registry import ModelRegistry
from services.trainer.schemas import CreateModelRequest, Datum, LossConfig, LossName
from services.trainer.settings import DEFAULT_MICRO_BATCH_TOKENS

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "micro_batches.md"
PROMPT_TOKENS = 12
CPU_BUDGET = DEFAULT_MICRO_BATCH_TOKENS["cpu"]
ONE_PASS = 1 << 30  # a budget no batch reaches: every row in one padded pass


def long_tailed_batch(rows: int, mean: int, cap: int, seed: int) -> list[Datum]:
    """Completions of geometric length (mean `mean`, at most `cap`), as sampled RL data."""
    rng = random.Random(seed)
    data = []
    for _ in range(rows):
        completion = min(cap, 1 + int(rng.expovariate(1 / mean)))
        ids = [rng.randrange(3, 200) for _ in range(PROMPT_TOKENS + completion)]
        mask = [0.0] * PROMPT_TOKENS + [1.0] * completion
        advantage = rng.uniform(-1, 1)
        data.append(
            Datum(
                input_ids=ids,
                loss_mask=mask,
                logprobs=[0.0] * PROMPT_TOKENS + [-5.0] * completion,
                advantages=[advantage * m for m in mask],
            )
        )
    return data


def model(work: Path, base: Path, budget: int) -> TrainerModel:
    registry = ModelRegistry(work / str(budget), torch.device("cpu"), budget)
    return registry.create(CreateModelRequest(job_id="bench", base_model=str(base)))[0]


def timed(trainer: TrainerModel, data: list[Datum]) -> float:
    began = time.perf_counter()
    trainer.forward_backward(data, LossConfig(name=LossName.ppo))
    elapsed = time.perf_counter() - began
    for _, param in trainer.named_trainable():
        param.grad = None
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--mean-tokens", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="loom-bench-micro-") as work:
        base = ensure_tiny_model(Path(work) / "tiny")
        arms = {
            "one padded pass": model(Path(work), base, ONE_PASS),
            "micro-batches": model(Path(work), base, CPU_BUDGET),
        }
        times: dict[str, list[float]] = {name: [] for name in arms}
        shapes = []
        for round_ in range(args.rounds + 1):
            data = long_tailed_batch(args.rows, args.mean_tokens, args.max_tokens, round_)
            lengths = [len(d.input_ids) for d in data]
            groups = micro_batches(lengths, CPU_BUDGET)
            for name, trainer in arms.items():
                elapsed = timed(trainer, data)
                if round_:  # round 0 warms both up
                    times[name].append(elapsed)
            if round_:
                shapes.append(
                    (
                        sum(lengths),
                        len(lengths) * max(lengths),
                        sum(len(g) * lengths[g[0]] for g in groups),
                        len(groups),
                    )
                )
    one, micro = (statistics.median(times[name]) for name in arms)
    rows = [
        "| arm | median s | min s | max s |",
        "|---|---|---|---|",
        *(
            f"| {name} | {statistics.median(t):.3f} | {min(t):.3f} | {max(t):.3f} |"
            for name, t in times.items()
        ),
    ]
    real, padded, micro_padded, passes = (statistics.mean(s[i] for s in shapes) for i in range(4))
    report = "\n".join(
        [
            "# Trainer micro-batches by length",
            "",
            f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} (CPU, one torch "
            f"thread), `python -m bench.micro_batches --rows {args.rows} --mean-tokens "
            f"{args.mean_tokens} --max-tokens {args.max_tokens} --rounds {args.rounds}`: the tiny "
            "model, full weights, one `forward_backward` (PPO, token mean) per arm and round on "
            f"the same batch: {args.rows} rows of a {PROMPT_TOKENS}-token prompt and a "
            f"completion of geometric length (mean {args.mean_tokens}, cap {args.max_tokens}), "
            "a new batch each round, the arms interleaved.",
            "",
            f"Per batch, on average: {real:.0f} real tokens; {padded:.0f} tokens as one padded "
            f"pass; {micro_padded:.0f} tokens in {passes:.1f} micro-batches of at most "
            f"{CPU_BUDGET} tokens (the default budget).",
            "",
            *rows,
            "",
            f"Speed-up of micro-batches over one padded pass (ratio of medians): "
            f"**{one / micro:.2f}x**",
            "",
        ]
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report)
    print(report)


if __name__ == "__main__":
    main()
