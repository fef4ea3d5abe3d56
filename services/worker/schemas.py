"""What each kind of background task takes (params) and gives (result): JSON-able pydantic
models, sent to the worker as `model_dump(mode="json")` and imported by the gateway and SDK."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, field_validator

from modelstate.schemas import AliasName, GcReport
from services.common.schemas import LenientModel, StrictModel
from services.rollout.schemas import SamplingParams

MAX_EVAL_ITEMS = 2_000
MAX_EVAL_TEXT = 100_000
EVAL_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"
RECIPE_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
# A run's config travels in its task row and its broker message: data belongs in files or
# in the config's own bounded fields, not in megabytes of JSON.
MAX_RECIPE_CONFIG_BYTES = 8 << 20

# A version number (0: the base model) or an alias such as "latest".
TaskVersionRef = Annotated[int, Field(ge=0)] | AliasName


class TaskKind(StrEnum):
    gc = "gc"
    evaluate = "evaluate"
    export = "export"
    recipe = "recipe"


class GcParams(StrictModel):
    """Garbage collection through modelstate: set the job's retention first when `keep_last`
    is given, then collect (retention of every job, unreferenced blobs, crash leftovers)."""

    keep_last: int | None = Field(
        default=None,
        ge=0,
        description="New retention of the job: keep its newest N versions "
        "(0: keep all); aliased and pinned versions are always kept. None: leave it as is.",
    )
    keep_ancestors: bool = Field(
        default=False, description="With keep_last: also keep ancestors of aliased versions."
    )


class EvalItem(StrictModel):
    prompt: str = Field(min_length=1, max_length=MAX_EVAL_TEXT)
    reference: str | None = Field(default=None, max_length=MAX_EVAL_TEXT)


def greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=64)


class EvaluateParams(StrictModel):
    """Sample one completion per item from a version, score them with a verifier, and record
    `eval/<name>/accuracy` and `eval/<name>/mean_reward` at the version's step."""

    name: str = Field(
        default="heldout",
        pattern=EVAL_NAME_PATTERN,
        description="Names the metrics: eval/<name>/accuracy, .../mean_reward.",
    )
    version: TaskVersionRef = "latest"
    items: list[EvalItem] = Field(min_length=1, max_length=MAX_EVAL_ITEMS)
    verifier: str = Field(
        min_length=1,
        max_length=64,
        description="A reward verifier: exact_match, math, regex, code, ...",
    )
    verifier_params: dict[str, Any] = Field(default={}, description="The verifier's options.")
    sampling: SamplingParams = Field(
        default_factory=greedy, description="Default: greedy, at most 64 tokens."
    )
    pass_threshold: float = Field(
        default=1.0, description="An item counts as correct when its reward is at least this."
    )


class ExportParams(StrictModel):
    """A LoRA version merged into its base model, written as a full Hugging Face directory
    under <data_dir>/exports/<job_id>/<version>/ on the worker's host."""

    version: TaskVersionRef = "latest"


class RecipeParams(StrictModel):
    """A managed run: Loom's worker runs a registered recipe (a training loop written with
    the SDK, `agents.recipes`) on the job, checkpointing as it goes, and resumes it from its
    last checkpoint after a worker or trainer crash."""

    recipe: str = Field(
        pattern=RECIPE_NAME_PATTERN,
        description="A registered recipe's name: `loom recipes` lists them.",
    )
    config: dict[str, Any] = Field(
        default={},
        description="The recipe's config, checked against its schema at submit "
        f"(at most {MAX_RECIPE_CONFIG_BYTES >> 20} MiB as JSON).",
    )

    @field_validator("config")
    @classmethod
    def _bounded(cls, config: dict[str, Any]) -> dict[str, Any]:
        size = len(json.dumps(config, separators=(",", ":")))
        if size > MAX_RECIPE_CONFIG_BYTES:
            raise ValueError(
                f"the config is {size} bytes as JSON; at most "
                f"{MAX_RECIPE_CONFIG_BYTES} are accepted"
            )
        return config


class PublishOptions(StrictModel):
    """What a checkpoint's `save_weights` asks for, kept so a resumed run publishes it again
    exactly (a republished step with identical files is the same version)."""

    aliases: list[AliasName] = []
    metrics: dict[str, float] = {}


class RunProgress(LenientModel):
    """A managed run's newest checkpoint: the step it finished, the trainer checkpoint saved
    after it, and the recipe's own state there (JSON). A resumed run starts at `step + 1`."""

    step: int = Field(ge=0)
    checkpoint: str
    state: dict[str, Any] = {}
    publish: PublishOptions = PublishOptions()


class RecipeResult(LenientModel):
    recipe: str
    steps: int = Field(description="The last step checkpointed.")
    attempts: int = Field(description="Attempts it took (more than 1: it resumed).")
    summary: dict[str, Any] = Field(description="What the recipe returned.")


class EvaluateResult(LenientModel):
    name: str
    version: int
    step: int
    count: int
    correct: int
    errors: int = Field(description="Items the verifier could not score (reward 0).")
    accuracy: float
    mean_reward: float
    metrics: list[str] = Field(description="Metric names recorded on the job at `step`.")


class ExportedFile(LenientModel):
    path: str
    size: int


class ExportResult(LenientModel):
    version: int
    path: str
    files: list[ExportedFile]


TASK_RESULTS: dict[TaskKind, type[LenientModel]] = {
    TaskKind.gc: GcReport,
    TaskKind.evaluate: EvaluateResult,
    TaskKind.export: ExportResult,
    TaskKind.recipe: RecipeResult,
}
