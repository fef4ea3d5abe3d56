"""Loom against Hugging Face TRL's `GRPOTrainer`, side by side (issue 38): the same model, task,
start and GRPO settings, arms interleaved round by round. Writes bench/results/vs_trl.md.

- Model and start: the tiny model (services/common/tiny_model.py, built here; nothing comes
  from a hub) after a short supervised warm-up, the demo's SFT in plain torch, run once and
  kept as a Hugging Face directory (`--start`): both arms start from these weights, Loom's
  stack serving it as its base model (LOOM_ROLLOUT_MODEL), with the KV cache Loom gives the
  tiny model (64 MiB).
- Task: the demo's `a+b=` problems (agents/datasets/arithmetic.py), reward 1 when the reply's
  first integer is the sum (the reward service's `first_integer` for Loom, the same function
  as TRL's reward function); held-out accuracy is greedy on the demo's 200 held-out problems,
  before the first step, every --eval-every steps and after the last, outside the timed
  steps and wall.
- GRPO (bench/_vs_trl_task.py `GrpoSetup`): 16 prompts x 8 samples, 8 new tokens,
  temperature 1, full weights, AdamW (lr 1e-3 constant unless --lr, betas 0.9/0.999, weight
  decay 0.01, gradient norm clipped at 1), group-normalised advantages (sample std), the
  clipped ratio (0.2 both sides), each sequence's token mean averaged over sequences (TRL's
  loss_type="grpo", Loom's `grpo()`), no KL, one optimizer step per batch.
- Arms: `trl` (bench/_vs_trl_trl.py, one process, transformers generation on CPU, torch's
  own thread count), `loom-sync` (the demo's loop, bench/_vs_trl_loom.py) and `loom-async` (the
  SDK's Pipeline, async, at most one version stale), each a client process against one
  embedded stack (the services `loom up` starts, with their default placement), started once
  for the whole run. Peak RSS is sampled every 0.1 s and summed over the arm's processes:
  TRL's one process; Loom's client plus every stack service and the processes they started.

    .venv/bin/python -m bench.vs_trl [--rounds 3] [--steps 30] [--arms trl,loom-sync,loom-async]
        [--eval-every 10]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench._rss import PeakRss, tree_rss
from bench._stack import LocalStack, local_stack
from bench._vs_trl_report import (
    Run,
    curve_table,
    main_table,
    phase_table,
    rounds_table,
    summarize,
)
from bench._vs_trl_task import GrpoSetup, build_start, warm_up_setup

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "vs_trl.md"
ARMS = ["trl", "loom-sync", "loom-async"]
# The KV cache Loom sizes for loom/tiny; a directory base model would get 1 GiB.
STACK_ENV = {"LOOM_ROLLOUT_KV_CACHE_GIB": str(64 / 1024), "HF_HUB_OFFLINE": "1"}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--lr", type=float, default=GrpoSetup.lr, help="both arms' learning rate")
    parser.add_argument(
        "--eval-every", type=int, default=10, help="held-out accuracy every this many steps"
    )
    parser.add_argument("--start", type=Path, default=REPO / "runs" / "bench_vs_trl" / "start")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    arms = args.arms.split(",")
    unknown = set(arms) - set(ARMS)
    if unknown:
        parser.error(f"unknown arms {sorted(unknown)}; known: {ARMS}")
    start = build_start(args.start.resolve())
    began = datetime.now(UTC)
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as work:
        runs, stack = measure(Path(work), start, arms, args)
    write(args, start, runs, stack, began)


def measure(
    work: Path, start: Path, arms: list[str], args: argparse.Namespace
) -> tuple[list[Run], Stack]:
    """Every arm once a round, in reverse order every other round."""
    runs: list[Run] = []
    env = {**STACK_ENV, "LOOM_ROLLOUT_MODEL": str(start)}
    began = time.perf_counter()
    with local_stack(work, env=env) as stack:
        at_rest = Stack(time.perf_counter() - began, tree_rss(stack_pids(stack)))
        for round_ in range(1, args.rounds + 1):
            order = arms if round_ % 2 else arms[::-1]
            for arm in order:
                runs.append(run_arm(work, stack, start, arm, round_, args))
                print(
                    f"round {round_} {arm}: {runs[-1].record['wall_s']:.1f} s, "
                    f"{runs[-1].peak_rss / 1e9:.2f} GB",
                    flush=True,
                )
    return runs, at_rest


@dataclass(frozen=True)
class Stack:
    """The embedded stack once ready: seconds it took to start, RSS summed at rest."""

    start_s: float
    rss: int


def stack_pids(stack: LocalStack) -> list[int]:
    return [service.pid for service in stack.supervisor.services]


def run_arm(
    work: Path, stack: LocalStack, start: Path, arm: str, round_: int, args: argparse.Namespace
) -> Run:
    """The arm's client process, its peak RSS (with the stack's, for Loom) sampled meanwhile."""
    out = work / f"{arm}-{round_}.json"
    if arm == "trl":
        command = ["-m", "bench._vs_trl_trl"]
    else:
        command = [
            "-m",
            "bench._vs_trl_loom",
            "--url",
            stack.settings.gateway_url,
            "--mode",
            arm.removeprefix("loom-"),
        ]
    command += [
        "--start",
        str(start),
        "--steps",
        str(args.steps),
        "--lr",
        str(args.lr),
        "--out",
        str(out),
        "--eval-every",
        str(args.eval_every),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LOOM_API_KEY": stack.api_key}
    load_before = os.getloadavg()[0]
    with (work / f"{arm}-{round_}.log").open("w") as log:
        process = subprocess.Popen(
            [sys.executable, *command], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        services = [] if arm == "trl" else stack_pids(stack)
        with PeakRss(lambda: [process.pid, *services]) as peak:
            code = process.wait()
    if code != 0:
        raise RuntimeError(
            f"{arm} (round {round_}) exited {code}: "
            f"{(work / f'{arm}-{round_}.log').read_text()[-3000:]}"
        )
    return Run(round_, json.loads(out.read_text()), peak.peak, load_before, os.getloadavg()[0])


def write(
    args: argparse.Namespace, start: Path, runs: list[Run], stack: Stack, began: datetime
) -> None:
    raw = start.parent / f"runs-{began:%Y%m%dT%H%M}.json"  # every record, to render again
    raw.write_text(json.dumps([asdict(r) for r in runs] + [asdict(stack)]))
    arms = summarize(runs)
    warm_up = json.loads((start / "start.json").read_text())
    threads = {r.record["threads"] for r in runs if "threads" in r.record}
    lines = [
        f"## {args.rounds} interleaved rounds x {args.steps} steps, {began:%Y-%m-%d %H:%M} UTC",
        "",
        f"Start: the tiny model after {warm_up['steps']} warm-up steps (validation accuracy "
        f"{warm_up['validation_accuracy']:.1%}). Settings: {GrpoSetup(lr=args.lr).to_json()}. "
        f"TRL's torch threads: {', '.join(map(str, sorted(threads))) or '-'}. The stack took "
        f"{stack.start_s:.0f} s to start and held {stack.rss / 1e9:.2f} GB RSS summed at rest "
        "before the first round. Start-up in the rounds table: the arm's process start to "
        "its first step (TRL: imports, model load, trainer; Loom: job creation; the held-out "
        "evaluation before training in both). 1-minute load average in the rounds table (a "
        "shared 2-core machine: times are upper bounds).",
        "",
        *main_table(arms),
        "",
        "Per phase, client-side medians over every step (TRL's inside its trainer: "
        "`_generate`, `_calculate_rewards`, training_step less its input preparation, "
        "`optimizer.step`; Loom's each waited for on its own in the sync loop; the async "
        "Pipeline's `wait` is the trainer waiting for groups, `train_publish` its "
        "forward_backward + optim_step + save_weights):",
        "",
        *phase_table(arms),
        "",
        f"Held-out greedy accuracy during training (200 problems, every {args.eval_every} "
        "steps and after the last; each evaluation outside the timed steps and wall), median "
        "over rounds (range):",
        "",
        *curve_table(arms),
        "",
        *rounds_table(runs),
        "",
    ]
    if not args.out.exists():
        args.out.write_text(header())
    with args.out.open("a") as fh:
        fh.write("\n".join(lines) + "\n")


def header() -> str:
    return (
        "# Loom against TRL's GRPOTrainer on the tiny model (issue 38)\n\n"
        + (__doc__ or "").split("\n\n    .venv")[0]
        + "\n\n"
        "Differences that remain between the arms: TRL's clipped ratio is to the logprobs of "
        "the weights it trains (one step per batch: the ratio is 1, the clip idle), Loom's to "
        "the sampler's (vLLM's) logprobs, equal up to numerics; TRL's advantage divides by "
        "std + 1e-4, Loom's by std + 1e-6; TRL also computes each token's entropy in its "
        "forward (a metric). Sampling: transformers' `generate` (padded batch of 128) against "
        "vLLM's CPU engine. Prompts: TRL's sampler draws 16 train problems a step with its "
        "seed, Loom's loop with Python's `random`, from the same train split. "
        f"Warm-up settings (the demo's SFT): {warm_up_setup()}.\n\n"
    )


if __name__ == "__main__":
    main()
