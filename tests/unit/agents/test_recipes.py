"""Recipes and the run they get: the order of a checkpoint's writes (what makes every crash
resumable without publishing a step twice), resuming, and config checks at submit."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from pydantic import ValidationError

from agents.examples.arith_grpo import ArithConfig
from agents.recipes import RecipeRun, RunStopped, load_recipe, registered
from agents.sdk.sync import JobClient, LoomClient
from services.common.errors import InvalidInput
from services.trainer.schemas import SaveWeightsResult
from services.worker.schemas import PublishOptions, RecipeParams, RunProgress


@dataclass
class Done:
    value: Any

    def result(self) -> Any:
        return self.value


@dataclass
class RecordingJob:
    """A stand-in for the blocking `JobClient`: records the calls a run makes, in order."""

    calls: list[str] = field(default_factory=list)
    published: list[PublishOptions] = field(default_factory=list)
    step: int = 0

    def ensure_model(self) -> None:
        self.calls.append("ensure_model")

    def save_state(self, name: str, series: str | None = None) -> Done:
        self.calls.append(f"save_state {name} series={series}")
        return Done(None)

    def load_state(self, name: str) -> Done:
        self.calls.append(f"load_state {name}")
        return Done(None)

    def save_weights(self, *, aliases: list[str], metrics: dict[str, float]) -> Done:
        self.calls.append("save_weights")
        self.published.append(PublishOptions(aliases=aliases, metrics=metrics))
        return Done(
            SaveWeightsResult(
                job_id="job_1", number=len(self.published), kind="lora", step=self.step
            )
        )


def make_run(
    job: RecordingJob, resumed: RunProgress | None = None, record: Any = None
) -> tuple[RecipeRun, list[RunProgress]]:
    recorded: list[RunProgress] = []

    def default_record(progress: RunProgress) -> None:
        job.calls.append(f"record {progress.step}")
        recorded.append(progress)

    run = RecipeRun(
        cast(LoomClient, None),
        cast(JobClient, job),
        run_id="task_1-a2",
        resumed=resumed,
        record=record or default_record,
        between_steps=lambda: job.calls.append("between"),
        series="task_1",
    )
    return run, recorded


def test_a_checkpoint_saves_then_records_then_publishes_then_stops_if_asked() -> None:
    job = RecordingJob()
    run, recorded = make_run(job)
    assert (run.start_step, run.state) == (1, {})
    version = run.checkpoint(2, {"loss": 0.5}, aliases=["best"], metrics={"loss": 0.5})
    assert job.calls == [
        "save_state task_1-a2-step-2 series=task_1",
        "record 2",
        "save_weights",
        "between",
    ]
    assert version.number == 1
    assert recorded == [
        RunProgress(
            step=2,
            checkpoint="task_1-a2-step-2",
            state={"loss": 0.5},
            publish=PublishOptions(aliases=["best"], metrics={"loss": 0.5}),
        )
    ]
    assert (run.start_step, run.state) == (3, {"loss": 0.5})
    with pytest.raises(ValueError, match="not after step 2"):
        run.checkpoint(2)


def test_a_run_that_lost_its_task_publishes_nothing() -> None:
    job = RecordingJob()

    def lost(_progress: RunProgress) -> None:
        raise RunStopped("taken over", cancel_task=False)

    run, _ = make_run(job, record=lost)
    with pytest.raises(RunStopped):
        run.checkpoint(1)
    assert "save_weights" not in job.calls


def test_resuming_loads_the_checkpoint_and_publishes_its_step_again_as_recorded() -> None:
    job = RecordingJob()
    progress = RunProgress(
        step=4,
        checkpoint="task_1-a1-step-4",
        state={"phase": "grpo"},
        publish=PublishOptions(aliases=["sft"], metrics={"reward": 0.25}),
    )
    run, _ = make_run(job, resumed=progress)
    run.restore()
    assert job.calls == ["ensure_model", "load_state task_1-a1-step-4", "save_weights"]
    assert job.published == [progress.publish]
    assert (run.start_step, run.state) == (5, {"phase": "grpo"})

    fresh = RecordingJob()
    make_run(fresh)[0].restore()
    assert fresh.calls == ["ensure_model"]


def test_the_built_in_recipes_are_registered_and_check_their_config() -> None:
    assert {"sft", "arith_grpo"} <= set(registered())
    assert load_recipe("arith_grpo").parse_config({}) == ArithConfig()
    sft = load_recipe("sft")
    with pytest.raises(InvalidInput, match="either `examples`"):
        sft.parse_config({"steps": 3})
    with pytest.raises(InvalidInput, match=r"steps: .*greater than or equal to 1") as caught:
        sft.parse_config({"steps": 0, "data": [{"input_ids": [1, 2], "loss_mask": [0, 1]}]})
    assert caught.value.detail == {
        "errors": [{"loc": ["steps"], "msg": "Input should be greater than or equal to 1"}]
    }
    with pytest.raises(InvalidInput, match="Extra inputs"):
        load_recipe("arith_grpo").parse_config({"rl_step": 3})
    with pytest.raises(InvalidInput, match=r"No recipe 'nope'; registered: \["):
        load_recipe("nope")


def test_an_oversized_config_is_refused_before_it_is_stored() -> None:
    too_big = {"examples": [{"prompt": "x" * 1024, "completion": "y"}] * (9 * 1024)}
    with pytest.raises(ValidationError, match="at most 8388608 are accepted"):
        RecipeParams(recipe="sft", config=too_big)
    assert RecipeParams(recipe="sft", config={"steps": 1}).config == {"steps": 1}
