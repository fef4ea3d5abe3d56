"""Multiplexing: N LoRA jobs sharing one rollout engine and one trainer, run at once, against
the same N jobs run one after another, on the real local stack (vLLM CPU engine, torch
trainer, tiny model). Writes bench/results/multiplex.md.

Each job is a GRPO loop through the SDK `Pipeline` in `sync` mode (sample a step's groups,
train, publish, repeat), so a single job leaves the engine idle while it trains and the
trainer idle while it samples; jobs run together fill each other's gaps. Both arms do the same
work (same jobs, steps, prompts, seeds); the ratio of their throughputs is the result.

    .venv/bin/python -m bench.multiplex [--jobs 4] [--steps 6]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psutil

from agents.algorithms import grpo
from agents.sdk import AsyncLoomClient, AsyncPipeline, SamplingParams
from bench._stack import LocalStack, local_stack
from bench.pipeline import ENGINE_BUSY, TRAINER_BUSY, Observed, arithmetic_tasks

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "multiplex.md"


@dataclass
class Measured:
    arm: str
    samples: int
    wall_s: float
    engine_busy_s: float
    trainer_busy_s: float
    trainer_rss_mib: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s


async def one_job(loom: AsyncLoomClient, name: str, args: argparse.Namespace) -> int:
    """A LoRA job's GRPO run; returns how many samples it trained on."""
    job = await loom.create_job("loom/tiny", name=name, mode="lora")
    algorithm = Observed(grpo())
    params = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=1)
    pipeline = AsyncPipeline(
        job,
        algorithm,
        env="arithmetic",  # type: ignore[arg-type]
        tasks=arithmetic_tasks(args.groups_per_step * (args.steps + 2)),
        groups_per_step=args.groups_per_step,
        group_size=args.group_size,
        params=params,
        mode="sync",
        epochs=args.epochs,
    )
    async for _ in pipeline.run(args.steps):
        pass
    return sum(len(g.trajectories) for g in algorithm.groups)


async def run_arm(
    stack: LocalStack, loom: AsyncLoomClient, arm: str, args: argparse.Namespace
) -> Measured:
    names = [f"{arm}-{i}" for i in range(args.jobs)]
    engine0 = stack.counter("rollout", ENGINE_BUSY)
    trainer0 = stack.counter("trainer", TRAINER_BUSY)
    began = time.perf_counter()
    if arm == "concurrent":
        samples = sum(await asyncio.gather(*(one_job(loom, n, args) for n in names)))
    else:
        samples = 0
        for name in names:
            samples += await one_job(loom, name, args)
    wall = time.perf_counter() - began
    rss = psutil.Process(stack.pid("trainer")).memory_info().rss / 2**20
    return Measured(
        arm,
        samples,
        wall,
        stack.counter("rollout", ENGINE_BUSY) - engine0,
        stack.counter("trainer", TRAINER_BUSY) - trainer0,
        rss,
    )


def table(results: list[Measured], args: argparse.Namespace, pinned: bool) -> str:
    baseline = results[0]
    rows = [
        "| arm | samples | wall s | samples/s | × one after another | engine busy | "
        "trainer busy | trainer RSS after (MiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r.arm} | {r.samples} | {r.wall_s:.1f} | {r.samples_per_s:.2f} | "
            f"{r.samples_per_s / baseline.samples_per_s:.2f} | "
            f"{r.engine_busy_s / r.wall_s:.0%} | {r.trainer_busy_s / r.wall_s:.0%} | "
            f"{r.trainer_rss_mib:.0f} |"
        )
    return "\n".join(
        [
            "# Multiplexing: LoRA jobs sharing one engine and one trainer",
            "",
            f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} "
            f"({os.cpu_count()} cores, {platform.machine()}, no GPU); `.venv/bin/python -m "
            f"bench.multiplex --jobs {args.jobs} --steps {args.steps} --groups-per-step "
            f"{args.groups_per_step} --group-size {args.group_size} --max-tokens {args.max_tokens} "
            f"--epochs {args.epochs} --max-loras {args.max_loras}"
            f"{'' if pinned else ' --no-pin'}`.",
            "",
            f"{args.jobs} LoRA jobs (rank 8) on the tiny model, each {args.steps} sync GRPO steps "
            f"of {args.groups_per_step} groups × {args.group_size} samples with {args.epochs} "
            f"optimizer passes per batch, published after every step; the engine keeps "
            f"{args.max_loras} adapters resident. *one after another* runs "
            "the jobs in turn; *concurrent* runs them at once on the same services (the engine "
            "holds every job's adapter, the trainer one base with an adapter per job). Busy "
            "fractions come from the services' busy-seconds counters. "
            + (
                "The engine runs on core 0, the trainer on core 1, as two devices would."
                if pinned
                else "No core pinning."
            ),
            "",
            *rows,
            "",
        ]
    )


async def main_async(args: argparse.Namespace) -> str:
    env = {
        "LOOM_ROLLOUT_KV_CACHE_GIB": "2",
        "LOOM_TRAINER_THREADS": "1",
        "LOOM_ROLLOUT_MAX_LORAS": str(args.max_loras),
    }
    cores = None
    if args.pin and (os.cpu_count() or 1) >= 2:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0"
        cores = {"rollout": [0], "trainer": [1]}
    with (
        tempfile.TemporaryDirectory(prefix="loom-bench-multiplex-") as work,
        local_stack(Path(work), env, cores) as stack,
    ):
        async with AsyncLoomClient(stack.settings.gateway_url, stack.api_key) as loom:
            # One-time costs (kernel compilation for new batch shapes, first adapter loads).
            await one_job(loom, "warm-up", argparse.Namespace(**{**vars(args), "steps": 2}))
            results = []
            for arm in ("one after another", "concurrent"):
                print(f"arm {arm} ...", flush=True)
                results.append(await run_arm(stack, loom, arm, args))
                print(f"  {results[-1].samples} samples in {results[-1].wall_s:.1f} s", flush=True)
    return table(results, args, cores is not None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--groups-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument(
        "--max-loras",
        type=int,
        default=None,
        help="LoRA slots on the engine (default: 2 per job, so each job's "
        "current adapter and the one being published both stay resident)",
    )
    parser.add_argument("--no-pin", dest="pin", action="store_false")
    args = parser.parse_args()
    args.max_loras = args.max_loras or 2 * args.jobs
    report = asyncio.run(main_async(args))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report)
    print(report)


if __name__ == "__main__":
    main()
