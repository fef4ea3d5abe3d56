"""Demo agentic RL job: the tiny model learns to multiply by calling a Python tool.

The model is asked `What is 47*86?`. It cannot multiply in its head (it is a ~1M-parameter
random init), but it can call the `python` tool of the `python_tool` environment: it writes
`<tool_call>{"name": "python", "arguments": {"code": "print(47*86)"}}</tool_call>`, the
sandbox service runs the program, the output comes back as a tool turn, and the model's next
turn is its answer, scored by the `math` verifier. Success therefore needs two copies: the
operands from the question into the code, the program's output into the answer.

1. Warm-up, supervised: first copying raw text (a pretrained base model can copy; a random
   init cannot, and without it the demonstrations barely teach more than the format), then
   rendered tool-use demonstrations (`render` tokenises a conversation exactly as a rollout
   would) until greedy success on a validation split reaches a target: enough to give RL a
   signal, not enough to solve the task.
2. GRPO (or DAPO) through the SDK's `Pipeline`: multi-turn rollouts with real tool calls,
   rewards from the reward service, training and weight hand-off, in `async` mode by
   default (rollouts of the next step overlap training of this one).
3. Greedy held-out success (and how often the model called the tool) before and after RL;
   the per-step reward curve as CSV.

    python -m agents.examples.python_tool_grpo --url http://127.0.0.1:8000 --api-key loom_...
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import random
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from rich.table import Table

from agents.algorithms import Algorithm, dapo, grpo, sft_datum
from agents.envs.python_tool import PYTHON_TOOL
from agents.examples.console import console, progress_bar
from agents.sdk import (
    AdamParams,
    Datum,
    JobClient,
    LoomClient,
    LossConfig,
    Pipeline,
    SamplingParams,
    StepResult,
    Trajectory,
)
from services.common.tiny_model import EOS
from services.rollout.tool_calls import ToolCall, format_tool_call, parse_tool_calls

ENV = "python_tool"
# Rendering is one request per conversation; a few in flight hide the round trips.
RENDER_THREADS = 8


@dataclass(frozen=True)
class DemoConfig:
    base_model: str = "loom/tiny"
    mode: str = "full"
    seed: int = 0
    held_out: int = 200
    validation: int = 100
    # Copy warm-up. Every solution copies twice (the operands into the code, the program's
    # output into the answer) and a random init cannot copy: on the demonstrations alone,
    # greedy success stayed at 0% for 500-800 SFT steps in 9 runs of 10 (batch 8 to 32, lr
    # 3e-3 to 6e-3, three phrasings of the question; in the tenth it jumped at ~420). A real
    # base model can copy; `copy_steps` steps on short raw-text copies (`4*07+2=4*07+2`)
    # give the tiny model that, after which success on the demonstrations passed 15% within
    # 150 steps in 6 runs of 6. Every copy is new: cycling through 4096 of them (9 passes),
    # the demonstrations stalled at 0% again in 3 runs of 4 (for up to 400 steps).
    copy_steps: int = 600
    copy_batch: int = 64
    # SFT on tool-use demonstrations: the format (the call's ~60 fixed tokens) is learnt first,
    # then success rises fast, so it is checked often and SFT stops once validation success
    # reaches `sft_target_success`: enough to give RL a signal, not enough to solve the task.
    # Each check publishes a version.
    sft_examples: int = 4000  # distinct demonstrations
    sft_target_success: float = 0.3
    sft_min_steps: int = 50
    sft_max_steps: int = 400
    sft_check_every: int = 10
    sft_batch: int = 16
    sft_lr: float = 3e-3
    weight_decay: float = 0.01
    # RL. Measured from the same SFT version (held-out 26.5%): 20 steps of 16 groups at lr
    # 1e-3 took it to 32.5% (temperature 1.0) and 33.0% (0.7); 30 steps of 8 groups at lr
    # 2e-3 to 20.5%. At 0.7 more samples succeed (train reward 0.14 vs 0.09 at the first
    # step), so fewer groups are all wrong and teach nothing.
    algorithm: str = "grpo"
    pipeline_mode: str = "async"
    max_staleness: int = 1
    rl_steps: int = 20
    groups_per_step: int = 16
    group_size: int = 8
    rl_lr: float = 1e-3
    temperature: float = 0.7
    max_tokens: int = 80  # per model turn: the tool call alone is ~62 tokens
    max_turns: int = 2  # the call, then the answer


# A smaller run (`--quick`): the same warm-up (it cannot be shortened: see above), fewer and
# smaller RL steps, smaller evaluation splits.
QUICK = dataclasses.replace(
    DemoConfig(), held_out=100, validation=64, rl_steps=8, groups_per_step=8
)


@dataclass(frozen=True)
class ToolTask:
    question: str
    code: str  # what a correct call runs
    output: str  # what that program prints
    answer: str


def multiplication(a: int, b: int) -> ToolTask:
    return ToolTask(f"What is {a}*{b}?", f"print({a}*{b})", f"{a * b}\n", str(a * b))


def demonstration(task: ToolTask) -> list[dict[str, str]]:
    """The episode a solver plays: call the tool, read its output, answer with it."""
    return [
        {"role": "user", "content": task.question},
        {"role": "assistant", "content": format_tool_call("python", {"code": task.code})},
        {"role": "tool", "content": task.output},
        {"role": "assistant", "content": task.answer},
    ]


def rollout_task(task: ToolTask) -> dict[str, str]:
    return {"prompt": task.question, "reference": task.answer}


class Splits(NamedTuple):
    train: list[ToolTask]
    validation: list[ToolTask]  # for stopping SFT, never for reporting
    held_out: list[ToolTask]  # touched only to report success


def make_splits(held_out: int, validation: int, seed: int = 0) -> Splits:
    """Every two-digit product `a*b`, shuffled, split three ways: no question is shared (`b*a`
    may be in another split: the model copies, it does not multiply)."""
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    random.Random(seed).shuffle(pairs)
    tasks = [multiplication(a, b) for a, b in pairs]
    cut = held_out + validation
    return Splits(tasks[cut:], tasks[held_out:cut], tasks[:held_out])


@dataclass(frozen=True)
class Evaluation:
    success: float  # reward 1: the final answer is the product
    tool_calls: float  # the first turn was a well-formed call of the python tool


def called_python(trajectory: Trajectory) -> bool:
    first = next((turn for turn in trajectory.turns if turn.kind == "model"), None)
    return first is not None and any(
        isinstance(call, ToolCall) and call.name == "python"
        for call in parse_tool_calls(first.text)
    )


def summarize(trajectories: Sequence[Trajectory]) -> Evaluation:
    n = len(trajectories)
    return Evaluation(
        success=sum(t.reward == 1.0 for t in trajectories) / n,
        tool_calls=sum(called_python(t) for t in trajectories) / n,
    )


def training_tasks(tasks: Sequence[ToolTask], rng: random.Random) -> Iterator[dict[str, str]]:
    """The RL task stream: the train split over and over, reshuffled each pass."""
    order = list(tasks)
    while True:
        rng.shuffle(order)
        yield from (rollout_task(t) for t in order)


COPY_ALPHABET = "0123456789*+-"


def copy_texts(n: int, rng: random.Random) -> list[str]:
    """Random strings of the characters the task copies, 3 to 10 long."""
    return ["".join(rng.choices(COPY_ALPHABET, k=rng.randint(3, 10))) for _ in range(n)]


@dataclass
class DemoResult:
    job_id: str
    sft_steps: int
    before: Evaluation  # held-out, the SFT version
    after: Evaluation  # held-out, the last RL version
    sft_version: int
    final_version: int
    wall_s: float
    curve: list[StepResult] = field(default_factory=list)
    csv_path: Path | None = None


def run_demo(url: str, api_key: str, out_dir: Path, config: DemoConfig | None = None) -> DemoResult:
    config = config or DemoConfig()
    started = time.perf_counter()
    rng = random.Random(config.seed)
    splits = make_splits(config.held_out, config.validation, config.seed)
    with LoomClient(url, api_key) as loom:
        job = loom.create_job(config.base_model, name="python-tool-grpo", mode=config.mode)
        console.print(f"[bold]Job[/bold] {job.id}: {config.base_model} ({config.mode}), env {ENV}")
        _copy_warmup(loom, job, config, rng)
        demos = _render(loom, splits.train[: config.sft_examples])
        sft_steps, sft_version = _sft(job, demos, splits.validation, config, rng)
        before = _evaluate(job, splits.held_out, config, sft_version)
        console.print(
            f"Held-out after SFT (version {sft_version}): {before.success:.1%} "
            f"success, {before.tool_calls:.1%} called the tool"
        )

        curve = _rl(job, splits.train, config, rng)
        final_version = curve[-1].version if curve else sft_version
        after = _evaluate(job, splits.held_out, config, final_version)
        console.print(
            f"Held-out after {config.algorithm.upper()} (version {final_version}): "
            f"{after.success:.1%} success, {after.tool_calls:.1%} called the tool"
        )

    result = DemoResult(
        job.id,
        sft_steps,
        before,
        after,
        sft_version,
        final_version,
        time.perf_counter() - started,
        curve,
    )
    result.csv_path = _write_curve(curve, out_dir)
    _print_summary(result, config)
    return result


def _adam(lr: float, config: DemoConfig) -> AdamParams:
    # beta2 0.95 (not the default 0.999): what the demo was tuned and measured with.
    return AdamParams(lr=lr, beta2=0.95, weight_decay=config.weight_decay)


def _copy_warmup(loom: LoomClient, job: JobClient, config: DemoConfig, rng: random.Random) -> None:
    """Supervised copying of raw text, `s=` → `s`: what a pretrained base model brings."""
    texts = copy_texts(config.copy_steps * config.copy_batch, rng)
    prompts = loom.tokenize([f"{t}=" for t in texts])
    copies = loom.tokenize([t + EOS for t in texts])
    data = [sft_datum(p, c) for p, c in zip(prompts, copies, strict=True)]
    with progress_bar() as progress:
        task = progress.add_task("Copy warm-up", total=config.copy_steps, info="")
        for start in range(0, len(data), config.copy_batch):
            loss = job.forward_backward(
                data[start : start + config.copy_batch], LossConfig(name="cross_entropy")
            )
            job.optim_step(_adam(config.sft_lr, config)).result()
            progress.update(task, advance=1, info=f"loss {loss.result().loss:.3f}")


def _render(loom: LoomClient, tasks: Sequence[ToolTask]) -> list[Datum]:
    """Each demonstration as training tokens: loss on the model's two turns only."""

    def render(task: ToolTask) -> Datum:
        rendered = loom.render(demonstration(task), tools=[PYTHON_TOOL])
        return Datum(input_ids=rendered.token_ids, loss_mask=rendered.loss_mask)

    with (
        console.status(f"Rendering {len(tasks)} demonstrations"),
        ThreadPoolExecutor(RENDER_THREADS) as pool,
    ):
        return list(pool.map(render, tasks))


def _sft(
    job: JobClient,
    demos: list[Datum],
    validation: list[ToolTask],
    config: DemoConfig,
    rng: random.Random,
) -> tuple[int, int]:
    """Supervised steps until validation success reaches the target (or the step budget
    ends); returns the steps taken and the version it stopped on (alias `sft`)."""
    version, step = 0, 0
    with progress_bar() as progress:
        task = progress.add_task("SFT on tool use", total=config.sft_max_steps, info="")
        for step in range(1, config.sft_max_steps + 1):
            loss = job.forward_backward(
                rng.sample(demos, config.sft_batch), LossConfig(name="cross_entropy")
            )
            job.optim_step(_adam(config.sft_lr, config)).result()
            progress.update(task, advance=1, info=f"loss {loss.result().loss:.3f}")
            due = step >= config.sft_min_steps and step % config.sft_check_every == 0
            if due or step == config.sft_max_steps:
                version = job.save_weights().result().number
                success = _evaluate(job, validation, config, version).success
                progress.update(task, info=f"validation success {success:.1%}")
                if success >= config.sft_target_success:
                    progress.update(task, total=step)
                    break
    job.move_alias("sft", version)
    return step, version


def _algorithm(config: DemoConfig) -> Algorithm:
    if config.algorithm == "dapo":
        return dapo(max_tokens=config.max_tokens)
    return grpo()


def _rl(
    job: JobClient, train: list[ToolTask], config: DemoConfig, rng: random.Random
) -> list[StepResult]:
    pipeline = Pipeline(
        job,
        _algorithm(config),
        env=ENV,
        tasks=training_tasks(train, rng),
        groups_per_step=config.groups_per_step,
        group_size=config.group_size,
        params=SamplingParams(max_tokens=config.max_tokens, temperature=config.temperature),
        mode=config.pipeline_mode,
        max_staleness=config.max_staleness,
        adam=_adam(config.rl_lr, config),
        max_turns=config.max_turns,
    )
    curve: list[StepResult] = []
    title = f"{config.algorithm.upper()} ({config.pipeline_mode})"
    with progress_bar() as progress:
        task = progress.add_task(title, total=config.rl_steps, info="")
        for step in pipeline.run(config.rl_steps):
            curve.append(step)
            progress.console.print(
                f"step {step.step:>3}  version {step.version}  reward {step.mean_reward:.3f}  "
                f"groups {step.groups} (dropped {step.dropped_stale} stale, "
                f"{step.abandoned_stale} cancelled as stale, "
                f"{step.dropped_filtered} filtered)  staleness {step.max_staleness}  "
                f"waited {step.wait_s:.1f} s  trained {step.train_s:.1f} s"
            )
            progress.update(task, advance=1, info=f"reward {step.mean_reward:.3f}")
    return curve


def _evaluate(
    job: JobClient, tasks: list[ToolTask], config: DemoConfig, version: int
) -> Evaluation:
    """Greedy episodes of `tasks` on one explicit version, with real tool calls."""
    stream = job.rollouts(
        [rollout_task(t) for t in tasks],
        env=ENV,
        params=SamplingParams(max_tokens=config.max_tokens, temperature=0.0),
        version=version,
        max_turns=config.max_turns,
    )
    trajectories = [t for group in stream for t in group.trajectories]
    if stream.errors:  # a failed episode is not a wrong answer: do not report it as one
        raise RuntimeError(
            f"{len(stream.errors)} evaluation episodes failed: {stream.errors[0].message}"
        )
    return summarize(trajectories)


REWARD_WINDOW = 5
CURVE_FIELDS = (
    "step",
    "version",
    "mean_reward",
    "groups",
    "dropped_filtered",
    "dropped_stale",
    "abandoned_stale",
    "failed_groups",
    "max_staleness",
    "loss",
    "wait_s",
    "train_s",
)


def _write_curve(curve: list[StepResult], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "reward_curve.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(CURVE_FIELDS)
        writer.writerows([_round(getattr(step, name)) for name in CURVE_FIELDS] for step in curve)
    return path


def _round(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else value


def _print_summary(result: DemoResult, config: DemoConfig) -> None:
    table = Table(title="Loom demo: python tool use")
    table.add_column("metric")
    table.add_column("before RL (after SFT)", justify="right")
    table.add_column("after RL", justify="right")
    table.add_row("version", str(result.sft_version), str(result.final_version))
    table.add_row(
        "held-out success (greedy)", f"{result.before.success:.1%}", f"{result.after.success:.1%}"
    )
    table.add_row(
        "held-out episodes that called the tool",
        f"{result.before.tool_calls:.1%}",
        f"{result.after.tool_calls:.1%}",
    )
    if result.curve:  # one step's reward is noisy: a few steps' mean at each end
        ends = [result.curve[:REWARD_WINDOW], result.curve[-REWARD_WINDOW:]]
        first, last = (sum(s.mean_reward for s in steps) / len(steps) for steps in ends)
        table.add_row(
            f"train reward (mean of the first / last {REWARD_WINDOW} steps)",
            f"{first:.3f}",
            f"{last:.3f}",
        )
    console.print(table)
    console.print(
        f"job {result.job_id}: {result.sft_steps} SFT steps, {len(result.curve)} "
        f"{config.algorithm.upper()} steps ({config.pipeline_mode}), "
        f"{result.wall_s:.0f} s; reward curve in {result.csv_path}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default=os.environ.get("LOOM_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--api-key", default=os.environ.get("LOOM_API_KEY"))
    parser.add_argument("--out", type=Path, default=Path("runs/python_tool_grpo"))
    parser.add_argument(
        "--quick", action="store_true", help="fewer, smaller RL steps and smaller evaluation splits"
    )
    parser.add_argument("--rl-steps", type=int, help="RL steps (default: 20, --quick 8)")
    parser.add_argument(
        "--mode",
        choices=["async", "sync"],
        default="async",
        help="pipeline mode (async: max_staleness 1)",
    )
    parser.add_argument("--algorithm", choices=["grpo", "dapo"], default="grpo")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not args.api_key:
        parser.error("--api-key (or LOOM_API_KEY) is required")
    config = dataclasses.replace(
        QUICK if args.quick else DemoConfig(),
        seed=args.seed,
        pipeline_mode=args.mode,
        algorithm=args.algorithm,
    )
    if args.rl_steps is not None:
        config = dataclasses.replace(config, rl_steps=args.rl_steps)
    run_demo(args.url, args.api_key, args.out, config)


if __name__ == "__main__":
    main()
