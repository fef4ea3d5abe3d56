"""bench/vs_trl.py's Loom arms, one client process against a running stack: a job on the shared
start checkpoint, then either the demo's synchronous loop (`sync`: sample_many, score,
forward_backward, optim_step, save_weights, as agents/examples/arith_grpo.py, each phase timed
on the client) or the SDK's `Pipeline` in async mode (`async`: sampling for the next step runs
while the trainer trains). Writes the same JSON record as the TRL arm.

    python -m bench._vs_trl_loom --url URL --api-key KEY --start DIR --mode sync --out rec.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from agents.algorithms import group_advantages, grpo, rl_datum
from agents.datasets.arithmetic import Problem
from agents.sdk import AdamParams, JobClient, LoomClient, Pipeline, SamplingParams, ScoreItem
from bench._vs_trl_task import Curve, GrpoSetup, arm_arguments, splits

STARTED = time.perf_counter()
VERIFIER = "first_integer"  # the arithmetic environment's default, TRL's reward function
BASE = 0  # a new job's version 0: its base model, the shared start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--api-key", default=os.environ.get("LOOM_API_KEY"))
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    arm_arguments(parser)
    args = parser.parse_args()
    setup = GrpoSetup(seed=args.seed, lr=args.lr)
    with (
        LoomClient(args.url, args.api_key) as loom,
        loom.create_job(str(args.start), name=f"vs-trl-{args.mode}", mode="full") as job,
    ):
        record = run(loom, job, args.mode, args.steps, setup, args.eval_every)
    args.out.write_text(json.dumps(record))


def run(
    loom: LoomClient, job: JobClient, mode: str, steps: int, setup: GrpoSetup, every: int
) -> dict[str, Any]:
    train, _, held_out = splits()
    curve = Curve(every, steps, lambda version: accuracy(loom, job, held_out, setup, version))
    curve.evaluate(0, BASE)
    setup_s = time.perf_counter() - STARTED
    rng = random.Random(setup.seed)
    began = time.perf_counter()
    if mode == "sync":
        phases, rewards = sync_loop(loom, job, train, steps, setup, rng, curve.after_step)
    else:
        phases, rewards = async_loop(job, train, steps, setup, rng, curve.after_step)
    wall = time.perf_counter() - began - curve.seconds
    return {
        "arm": f"loom-{mode}",
        "wall_s": wall,
        "step_s": phases.pop("step"),
        "phases": phases,
        "accuracy_before": curve.points[0][1],
        "accuracy_after": curve.points[-1][1],
        "curve": curve.points,
        "rewards": rewards,
        "setup_s": setup_s,
    }


def adam(setup: GrpoSetup) -> AdamParams:
    return AdamParams(
        lr=setup.lr,
        beta1=setup.beta1,
        beta2=setup.beta2,
        weight_decay=setup.weight_decay,
        grad_clip=setup.grad_clip,
    )


def sampling(setup: GrpoSetup) -> SamplingParams:
    return SamplingParams(max_tokens=setup.max_tokens, temperature=setup.temperature)


def sync_loop(
    loom: LoomClient,
    job: JobClient,
    train: list[Problem],
    steps: int,
    setup: GrpoSetup,
    rng: random.Random,
    after_step: Callable[[int, int], float],
) -> tuple[dict[str, list[float]], list[float]]:
    """The demo's loop, every group trained (zero advantages where all rewards are equal, as
    TRL does), each phase waited for on its own so it can be timed; `after_step(step,
    version)` evaluates, outside the timed step."""
    phases: dict[str, list[float]] = defaultdict(list)
    rewards_per_step: list[float] = []
    loss = grpo(clip=setup.clip).loss
    version = BASE
    for step in range(1, steps + 1):
        began = last = time.perf_counter()

        def lap(phase: str) -> None:
            nonlocal last
            now = time.perf_counter()
            phases[phase].append(now - last)
            last = now

        batch = rng.sample(train, setup.prompts)
        responses = job.sample_many(
            [p.prompt for p in batch], n=setup.group, params=sampling(setup), version=version
        )
        lap("sample")
        items = [
            ScoreItem(response=s.text, reference=p.answer)
            for p, r in zip(batch, responses, strict=True)
            for s in r.samples
        ]
        rewards = [s.reward for s in loom.score(VERIFIER, items).scores]
        lap("score")
        data = []
        for i, response in enumerate(responses):
            group = rewards[i * setup.group : (i + 1) * setup.group]
            for sample, advantage in zip(response.samples, group_advantages(group), strict=True):
                data.append(rl_datum(response.prompt_token_ids, sample, advantage))
        job.forward_backward(data, loss).result()
        lap("forward_backward")
        job.optim_step(adam(setup)).result()
        lap("optim")
        version = job.save_weights().result().number
        lap("save_publish")
        phases["step"].append(time.perf_counter() - began)
        rewards_per_step.append(sum(rewards) / len(rewards))
        after_step(step, version)
    return phases, rewards_per_step


def async_loop(
    job: JobClient,
    train: list[Problem],
    steps: int,
    setup: GrpoSetup,
    rng: random.Random,
    after_step: Callable[[int, int], float],
) -> tuple[dict[str, list[float]], list[float]]:
    """The SDK's Pipeline, async (groups for the next step sampled while this one trains, at
    most one version stale), the `arithmetic` environment scoring by first integer;
    `after_step` as in `sync_loop` (the Pipeline's sampling for the next step goes on
    meanwhile)."""
    tasks = [
        {"prompt": p.prompt, "reference": p.answer}
        for p in rng.choices(train, k=2 * steps * setup.prompts)
    ]
    pipeline = Pipeline(
        job,
        grpo(clip=setup.clip),
        env="arithmetic",
        tasks=tasks,
        groups_per_step=setup.prompts,
        group_size=setup.group,
        params=sampling(setup),
        mode="async",
        max_staleness=1,
        adam=adam(setup),
    )
    phases: dict[str, list[float]] = defaultdict(list)
    rewards: list[float] = []
    last = time.perf_counter()
    for number, step in enumerate(pipeline.run(steps), start=1):
        now = time.perf_counter()
        phases["step"].append(now - last)
        phases["wait"].append(step.wait_s)
        phases["train_publish"].append(step.train_s)
        rewards.append(step.mean_reward)
        after_step(number, step.version)
        last = time.perf_counter()
    return phases, rewards


def accuracy(
    loom: LoomClient, job: JobClient, problems: list[Problem], setup: GrpoSetup, version: int
) -> float:
    """Greedy held-out accuracy of one version (scored like the rewards)."""
    params = SamplingParams(max_tokens=setup.max_tokens, temperature=0.0)
    responses = job.sample_many([p.prompt for p in problems], params=params, version=version)
    items = [
        ScoreItem(response=r.samples[0].text, reference=p.answer)
        for p, r in zip(problems, responses, strict=True)
    ]
    scores = loom.score(VERIFIER, items).scores
    return sum(s.reward for s in scores) / len(scores)


if __name__ == "__main__":
    main()
