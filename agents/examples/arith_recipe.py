"""The demo as a managed run: recipe `arith_grpo`, the same SFT warm-up and GRPO steps as
`arith_grpo.py`, run by Loom's worker on an existing job, checkpointed and resumable.

Steps are numbered across both phases: SFT steps 1..S (S: where validation accuracy reached
the target), then GRPO steps S+1..S+rl_steps. Each SFT check and every GRPO step is a
checkpoint (GRPO samples the version the previous step published, so it publishes every
step). Batches come from a generator seeded by the step, so a resumed run draws the batches
the first attempt would have.

    job = loom.create_job("loom/tiny", mode="full")
    job.run_recipe("arith_grpo", {"rl_steps": 40}).result()
"""

from __future__ import annotations

import random
from typing import Any

from agents.datasets.arithmetic import make_splits
from agents.examples.arith_grpo import ArithConfig, Encoded, encode, evaluate, grpo_step, sft_step
from agents.recipes.recipe import Recipe
from agents.recipes.run import RecipeRun


def run_arith(run: RecipeRun, config: ArithConfig) -> dict[str, Any]:
    splits = make_splits(held_out=config.held_out, validation=config.validation, seed=config.seed)
    train, validation, held_out = encode(run.loom, splits)
    state = run.state
    if "sft_end" not in state:
        state = _sft(run, train, validation, config)
        # GRPO's first step is a new phase: a fresh AdamW (a run resumed within GRPO restores
        # GRPO's own moments from its checkpoint; one resumed at the SFT check resets again).
        run.job.reset_optimizer().result()
    _grpo(run, train, validation, config, state)
    best = run.job.version("best").number
    return {
        "sft_steps": state["sft_end"],
        "sft_version": state["sft_version"],
        "best_version": best,
        "last_version": run.job.version("latest").number,
        "held_out_accuracy_sft": evaluate(
            run.loom, run.job, held_out, config, state["sft_version"]
        ),
        "held_out_accuracy_best": evaluate(run.loom, run.job, held_out, config, best),
    }


def _batch(items: list[Encoded], size: int, config: ArithConfig, step: int) -> list[Encoded]:
    return random.Random(f"{config.seed}:{step}").sample(items, size)


def _sft(
    run: RecipeRun, train: list[Encoded], validation: list[Encoded], config: ArithConfig
) -> dict[str, Any]:
    """SFT steps until a check reaches the target accuracy; the state GRPO starts from."""
    if run.last is not None:  # resumed at a check: decide on its version first
        decided = _check(run, run.job.version("latest").number, run.last.step, validation, config)
        if decided:
            return decided
    for step in range(run.start_step, config.sft_max_steps + 1):
        loss = sft_step(run.job, _batch(train, config.sft_batch, config, step), config, step)
        run.job.log_metrics(step, {"sft/loss": loss})
        if (
            step >= config.sft_min_steps
            and step % config.sft_check_every == 0
            or step == config.sft_max_steps
        ):
            version = run.checkpoint(step, metrics={"sft/loss": loss}).number
            decided = _check(run, version, step, validation, config)
            if decided:
                return decided
    raise AssertionError("the last SFT step is always a check that decides")


def _check(
    run: RecipeRun, version: int, step: int, validation: list[Encoded], config: ArithConfig
) -> dict[str, Any] | None:
    accuracy = evaluate(run.loom, run.job, validation, config, version)
    run.job.log_metrics(step, {"sft/validation_accuracy": accuracy})
    if accuracy < config.sft_target_accuracy and step < config.sft_max_steps:
        return None
    run.job.move_alias("sft", version)
    run.job.move_alias("best", version)
    return {
        "sft_end": step,
        "sft_version": version,
        "best_version": version,
        "best_accuracy": accuracy,
    }


def _grpo(
    run: RecipeRun,
    train: list[Encoded],
    validation: list[Encoded],
    config: ArithConfig,
    state: dict[str, Any],
) -> None:
    first = state["sft_end"] + 1
    version = run.job.version("latest").number
    for step in range(max(first, run.start_step), first + config.rl_steps):
        done = grpo_step(
            run.loom,
            run.job,
            _batch(train, config.prompts_per_step, config, step),
            config,
            version,
            step,
            config.rl_lr_at(step - state["sft_end"]),
        )
        version = run.checkpoint(step, state, metrics={"reward": done.metrics["reward"]}).number
        metrics = dict(done.metrics)
        rl_step = step - first + 1
        if rl_step % config.eval_every == 0 or rl_step == config.rl_steps:
            # After publishing (sampling needs a version): the next checkpoint records the
            # new best; the `best` alias moves at once and is what the summary reads.
            accuracy = evaluate(run.loom, run.job, validation, config, version)
            metrics["validation_accuracy"] = accuracy
            if accuracy > state["best_accuracy"]:
                state = {**state, "best_version": version, "best_accuracy": accuracy}
                run.job.move_alias("best", version)
        run.job.log_metrics(rl_step, {f"rl/{name}": value for name, value in metrics.items()})
        run.job.log_samples(done.samples)


ARITH_GRPO = Recipe(
    name="arith_grpo",
    config=ArithConfig,
    run=run_arith,
    description="The demo: two-digit addition, SFT warm-up then GRPO.",
    services=("trainer", "modelstate", "rollout", "reward"),
)
