"""RL pipeline throughput: samples trained per second and bubbles (the idle fraction of the
rollout engine and of the trainer) for the SDK pipeline in `sync`, `async` and
`async + partial rollouts + length-aware scheduling`, at equal sample counts, on the real local
stack (vLLM CPU engine, torch trainer) with the tiny model. Writes bench/results/pipeline.md.

Output lengths are long-tailed: a stop token is picked so that the model, sampling freely,
emits it at a rate giving a mean length of `--mean-tokens`, capped at `--max-tokens` (a
geometric distribution: most replies short, a few run to the cap). On a 2-core machine the
engine (vLLM's EngineCore and worker processes) and the trainer get a core each (`--no-pin` to
let them share), so what a bubble costs is what it would cost with a device each; every other
process (the rollout service's own, gateway, reward, modelstate, this client) runs wherever
the OS finds room, as host work does beside the devices.

The defaults (2 optimizer passes a step, groups up to 4 versions old) make generation about
two thirds of a sync step, as in RL runs where sampling dominates. Where training takes longer
than generation (`--epochs 4` here), the async arms wait on the trainer and no pipeline can
beat sync by more than (generation + training) / training, under 2×.

Each run trains 32 steps, so the fill (the trainer idle while the first batch is sampled, paid
once per job; the "first batch s" column) weighs less, and the steady state more, than in a
short run: at 16 steps the fill alone was 6-8% of an async arm's wall time.

`--rounds` runs every arm once a round (in the reverse order every other round, on the same
stack): the machine's speed drifts by ±20% over minutes, so a single run of each arm can land
on either side of a target. Ratios and bubbles are over all rounds' samples and seconds.

    .venv/bin/python -m bench.pipeline [--rounds 3] [--steps 32] [--epochs 2] [--max-staleness 4]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agents.algorithms import grpo
from agents.algorithms.algorithm import Algorithm, TrainingBatch
from agents.sdk import (
    AsyncJobClient,
    AsyncLoomClient,
    AsyncPipeline,
    LossConfig,
    SamplingParams,
    StepResult,
)
from bench._stack import LocalStack, local_stack, pin_threads
from services.rollout.schemas import RolloutGroup, SampleRequest

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "pipeline.md"
MIN_SPEEDUP, MAX_BUBBLE = 2.5, 0.15
ENGINE_BUSY = "loom_rollout_engine_busy_seconds_total"
TRAINER_BUSY = "loom_trainer_busy_seconds_total"


@dataclass(frozen=True)
class Arm:
    name: str
    mode: str
    options: dict[str, Any] = field(default_factory=dict)


PARTIAL = {"version_refresh": "partial", "schedule": "longest_prompt_first"}
ARMS = [
    Arm("sync", "sync"),
    Arm("async", "async"),
    Arm("async+partial+length-aware", "async", PARTIAL),
    # AReaL's bound: on how far ahead groups start; late groups are trained, not dropped.
    Arm(
        "async+partial+length-aware, bound on starts",
        "async",
        {**PARTIAL, "staleness_bound": "started"},
    ),
]


@dataclass
class Measured:
    arm: Arm
    steps: list[StepResult]
    wall_s: float
    engine_busy_s: float
    trainer_busy_s: float
    lengths: list[int]  # of every sample trained on

    @property
    def samples(self) -> int:
        return len(self.lengths)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s

    @property
    def engine_bubble(self) -> float:
        return 1 - self.engine_busy_s / self.wall_s

    @property
    def trainer_bubble(self) -> float:
        return 1 - self.trainer_busy_s / self.wall_s


def pooled(runs: list[Measured]) -> Measured:
    """One arm's rounds as one run: their steps, samples and seconds together."""
    return Measured(
        runs[0].arm,
        [s for r in runs for s in r.steps],
        sum(r.wall_s for r in runs),
        sum(r.engine_busy_s for r in runs),
        sum(r.trainer_busy_s for r in runs),
        [n for r in runs for n in r.lengths],
    )


@dataclass
class Observed:
    """The algorithm, noting each group the trainer is given."""

    inner: Algorithm
    groups: list[RolloutGroup] = field(default_factory=list)

    @property
    def loss(self) -> LossConfig:
        return self.inner.loss

    def batch(self, groups: list[RolloutGroup]) -> TrainingBatch:
        self.groups.extend(groups)
        return self.inner.batch(groups)


async def calibrate_stop_tokens(
    loom: AsyncLoomClient, mean_tokens: int, max_tokens: int
) -> tuple[list[int], float]:
    """Tokens the base model, sampling freely, emits about once per `mean_tokens` tokens
    between them (the most frequent first, until their rates add up)."""
    response = await loom.sample(
        SampleRequest(
            prompt="1+2=",
            n=64,
            params=SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=0),
        )
    )
    counts = Counter(t for s in response.samples for t in s.token_ids)
    total = sum(counts.values())
    chosen: list[int] = []
    rate = 0.0
    for token, count in counts.most_common():
        if rate >= 1 / mean_tokens:
            break
        chosen.append(token)
        rate += count / total
    return chosen, rate


def arithmetic_tasks(count: int) -> list[dict[str, str]]:
    return [
        {"prompt": f"{a % 97}+{b % 89}=", "reference": str(a % 97 + b % 89)}
        for a, b in zip(range(count), range(7, 7 + 3 * count, 3), strict=True)
    ]


async def run_arm(
    stack: LocalStack,
    loom: AsyncLoomClient,
    arm: Arm,
    args: argparse.Namespace,
    stop_tokens: list[int],
    name: str,
) -> Measured:
    job: AsyncJobClient = await loom.create_job("loom/tiny", name=name, mode=args.mode)
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=1.0, seed=1, stop_token_ids=stop_tokens
    )
    # Enough that no arm runs out: dropped groups use tasks up, and an arm whose tasks ran out
    # would drain its pipeline at the end (the trainer idle while the last groups finish).
    tasks = arithmetic_tasks(2 * args.groups_per_step * args.steps)
    algorithm = Observed(grpo())
    pipeline = AsyncPipeline(
        job,
        algorithm,
        env="arithmetic",  # type: ignore[arg-type]
        tasks=tasks,
        groups_per_step=args.groups_per_step,
        group_size=args.group_size,
        params=params,
        mode=arm.mode,
        max_staleness=args.max_staleness,
        oversample=args.oversample,
        epochs=args.epochs,
        **arm.options,
    )
    engine0 = stack.counter("rollout", ENGINE_BUSY)
    trainer0 = stack.counter("trainer", TRAINER_BUSY)
    began = time.perf_counter()
    steps = [step async for step in pipeline.run(args.steps)]
    wall = time.perf_counter() - began
    engine_busy = stack.counter("rollout", ENGINE_BUSY) - engine0
    trainer_busy = stack.counter("trainer", TRAINER_BUSY) - trainer0
    lengths = [sum(t.loss_mask) for g in algorithm.groups for t in g.trajectories]
    return Measured(arm, steps, wall, engine_busy, trainer_busy, lengths)


def percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def table(
    rounds: list[list[Measured]],
    args: argparse.Namespace,
    stop: tuple[list[int], float],
    pinned: bool,
) -> str:
    """`rounds`: per round, every arm's run, in the arms' order."""
    results = [pooled(list(runs)) for runs in zip(*rounds, strict=True)]
    sync = results[0]
    per_round = [[r.samples_per_s / runs[0].samples_per_s for r in runs] for runs in rounds]
    rows = [
        "| arm | samples | wall s | samples/s | × sync | × sync per round | engine bubble | "
        "trainer bubble | max staleness | stale groups dropped / cancelled | first batch s | "
        "wait s/step | train s/step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(results):
        rows.append(
            f"| {r.arm.name} | {r.samples} | {r.wall_s:.1f} | {r.samples_per_s:.2f} | "
            f"{r.samples_per_s / sync.samples_per_s:.2f} | "
            f"{', '.join(f'{ratios[i]:.2f}' for ratios in per_round)} | {r.engine_bubble:.0%} | "
            f"{r.trainer_bubble:.0%} | {max(s.max_staleness for s in r.steps)} | "
            f"{sum(s.dropped_stale for s in r.steps)} / "
            f"{sum(s.abandoned_stale for s in r.steps)} | "
            f"{statistics.mean(runs[i].steps[0].wait_s for runs in rounds):.2f} | "
            f"{statistics.mean(s.wait_s for s in r.steps):.2f} | "
            f"{statistics.mean(s.train_s for s in r.steps):.2f} |"
        )
    lengths = sync.lengths
    header = [
        "# RL pipeline: throughput and bubbles",
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} "
        f"({os.cpu_count()} cores, {platform.machine()}, no GPU); "
        f"`.venv/bin/python -m bench.pipeline --rounds {args.rounds} --steps {args.steps} "
        f"--groups-per-step "
        f"{args.groups_per_step} --group-size {args.group_size} --max-tokens {args.max_tokens} "
        f"--mean-tokens {args.mean_tokens} --epochs {args.epochs} --mode {args.mode} "
        f"--max-staleness {args.max_staleness} --oversample {args.oversample}"
        f"{'' if pinned else ' --no-pin'}{' --lora-layers' if args.lora_layers else ''}`.",
        "",
        f"{len(rounds)} round(s); in each, every arm trains a fresh "
        f"{'LoRA' if args.mode == 'lora' else 'full-weights'} job on "
        "the tiny model for the same number of steps "
        f"({args.steps} × {args.groups_per_step} groups × {args.group_size} samples, GRPO "
        f"with {args.epochs} optimizer passes per batch, arithmetic prompts) through the SDK "
        f"`Pipeline` and the real services; the async arms accept groups up to "
        f"{args.max_staleness} versions old. "
        "Bubbles come from the services' own busy-seconds counters (`/metrics`): the "
        "fraction of the arm's wall time with no generation in flight (engine) or no "
        "operation running (trainer). First batch: the wait for a run's first step's groups, "
        "the pipeline's fill, which the trainer spends idle in every arm (averaged over rounds). "
        + (
            "The engine (vLLM's EngineCore and worker processes) runs on core 0, the trainer "
            "(one torch thread) on core 1; every other process (the rollout service's own, "
            "gateway, reward, modelstate, the bench's client) wherever the OS puts it."
            if pinned
            else "No core pinning."
        )
        + (
            " Full-weights jobs only, so the engine runs without LoRA layers "
            "(`LOOM_ROLLOUT_MAX_LORAS=0`; `--lora-layers` keeps them)."
            if args.mode == "full" and not args.lora_layers
            else ""
        ),
        "",
        f"Output lengths (sync arm, tokens): p50 {percentile(lengths, 0.5):.0f}, "
        f"p90 {percentile(lengths, 0.9):.0f}, p99 {percentile(lengths, 0.99):.0f}, "
        f"max {max(lengths)}; stop tokens {stop[0]} (base-model rate {stop[1]:.4f}/token), "
        f"cap {args.max_tokens}.",
        "",
    ]
    verdict = [""]
    for r in results:
        if not r.arm.name.startswith("async+partial"):
            continue
        speedup = r.samples_per_s / sync.samples_per_s
        bubble = max(r.engine_bubble, r.trainer_bubble)
        verdict.append(
            f"Targets ({r.arm.name}): ≥ {MIN_SPEEDUP}× sync throughput: {speedup:.2f}× — "
            f"{'PASS' if speedup >= MIN_SPEEDUP else 'FAIL'}; bubble ≤ {MAX_BUBBLE:.0%} (worse "
            f"of engine and trainer): {bubble:.1%} — "
            f"{'PASS' if bubble <= MAX_BUBBLE else 'FAIL'}."
        )
        verdict.append("")
    return "\n".join(header + rows + verdict)


async def main_async(args: argparse.Namespace) -> str:
    env = {"LOOM_ROLLOUT_KV_CACHE_GIB": "2", "LOOM_TRAINER_THREADS": "1"}
    if args.mode == "full" and not args.lora_layers:  # full weights only: no LoRA layers
        env["LOOM_ROLLOUT_MAX_LORAS"] = "0"
    cores = None
    if args.pin and (os.cpu_count() or 1) >= 2:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0"
        cores = {"rollout": [0], "trainer": [1]}
    with (
        tempfile.TemporaryDirectory(prefix="loom-bench-pipeline-") as work,
        local_stack(Path(work), env, cores) as stack,
    ):
        if cores is not None:  # vLLM's processes inherited core 0; the service itself is host work
            pin_threads(stack.pid("rollout"), range(os.cpu_count() or 1))
        async with AsyncLoomClient(stack.settings.gateway_url, stack.api_key) as loom:
            stop = await calibrate_stop_tokens(loom, args.mean_tokens, args.max_tokens)
            # One-time costs (vLLM compiles its logprob kernels for new batch shapes, the first
            # LoRA loads) are paid here, not by whichever arm runs first.
            await run_arm(
                stack,
                loom,
                ARMS[-1],
                argparse.Namespace(**{**vars(args), "steps": 2}),
                stop[0],
                "bench-warm-up",
            )
            arms = [arm for arm in ARMS if not args.arms or arm.name in args.arms]
            rounds = []
            for round_ in range(1, args.rounds + 1):
                order = arms if round_ % 2 else arms[::-1]
                runs: dict[str, Measured] = {}
                for arm in order:
                    print(f"round {round_}, arm {arm.name} ...", flush=True)
                    r = await run_arm(stack, loom, arm, args, stop[0], f"bench-{arm.name}-{round_}")
                    runs[arm.name] = r
                    print(
                        f"  {r.samples} samples in {r.wall_s:.1f} s, engine bubble "
                        f"{r.engine_bubble:.0%}, trainer bubble {r.trainer_bubble:.0%}",
                        flush=True,
                    )
                rounds.append([runs[arm.name] for arm in arms])
    return table(rounds, args, stop, cores is not None)


def main() -> None:
    import asyncio

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="every arm once a round, the order reversed every other round",
    )
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--groups-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--mean-tokens", type=int, default=48)
    parser.add_argument(
        "--epochs",
        type=int,
        default=2,
        help="optimizer passes per batch: sets the trainer's share of the work",
    )
    parser.add_argument(
        "--mode",
        choices=["lora", "full"],
        default="full",
        help="what each job trains and hands to the engine",
    )
    parser.add_argument(
        "--max-staleness",
        type=int,
        default=4,
        help="of the async arms: how many versions a trained group may lag",
    )
    parser.add_argument(
        "--oversample",
        type=float,
        default=1.0,
        help="groups asked for per group a step needs, in every arm",
    )
    parser.add_argument("--no-pin", dest="pin", action="store_false")
    parser.add_argument(
        "--lora-layers",
        action="store_true",
        help="--mode full: build the engine with LoRA layers all the same",
    )
    parser.add_argument("--arms", nargs="*", help="a subset, by name (the first is the baseline)")
    args = parser.parse_args()
    report = asyncio.run(main_async(args))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report)
    print(report)


if __name__ == "__main__":
    main()
