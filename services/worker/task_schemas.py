"""Wire models of background tasks (`/v1/jobs/{job}/tasks`, `/v1/tasks`): what to submit and
what a task looks like; and what the worker sends the gateway's internal routes (`TaskEnd`,
`RunKey`). Each kind's params and result are in `services/worker/schemas.py`."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from services.common.schemas import ErrorBody, LenientModel, MetricPoint, StrictModel
from services.worker.schemas import (
    EvaluateParams,
    ExportParams,
    GcParams,
    RecipeParams,
    RunProgress,
    TaskKind,
)

IdempotencyKey = Annotated[
    str | None,
    Field(
        default=None,
        min_length=1,
        max_length=128,
        description="Submitting again with the same key (for the same job) returns the task the "
        "first submit created instead of a new one.",
    ),
]


class TaskStatus(StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


class GcTaskCreate(StrictModel):
    kind: Literal["gc"]
    params: GcParams = GcParams()
    idempotency_key: IdempotencyKey = None


class EvaluateTaskCreate(StrictModel):
    kind: Literal["evaluate"]
    params: EvaluateParams
    idempotency_key: IdempotencyKey = None


class ExportTaskCreate(StrictModel):
    kind: Literal["export"]
    params: ExportParams = ExportParams()
    idempotency_key: IdempotencyKey = None


class RecipeTaskCreate(StrictModel):
    kind: Literal["recipe"]
    params: RecipeParams
    idempotency_key: IdempotencyKey = None


TaskCreate = Annotated[
    GcTaskCreate | EvaluateTaskCreate | ExportTaskCreate | RecipeTaskCreate,
    Field(discriminator="kind"),
]


class BackgroundTask(LenientModel):
    id: str
    job_id: str | None = Field(description="None for store-wide work (the scheduled gc).")
    kind: TaskKind
    params: dict[str, Any]
    status: TaskStatus
    result: dict[str, Any] | None = None
    error: ErrorBody | None = Field(
        default=None,
        description="Why it failed; on a queued task, the upstream outage it "
        "waits out before its next attempt.",
    )
    attempts: int = Field(description="Times a worker started it.")
    progress: RunProgress | None = Field(
        default=None, description="A recipe run: its newest checkpoint, where it resumes."
    )
    idempotency_key: str | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def done(self) -> bool:
        return self.status in (TaskStatus.succeeded, TaskStatus.failed, TaskStatus.cancelled)


class BackgroundTaskList(LenientModel):
    tasks: list[BackgroundTask]


class TaskEnd(StrictModel):
    """How a task ended, for the gateway to record when the end moves rows it owns: a managed
    run's job ends with its run (`gateway.jobs.jobs.end_with_run`), an evaluation's metrics are the
    job's. `PUT /v1/internal/tasks/{id}/end` records the task's end and those rows in one
    transaction; sent again after a lost answer, it records nothing twice."""

    attempt: int | None = Field(
        ge=1,
        description="The attempt that ended; None: the task was queued, waiting for "
        "services, and the wait gave up (it fails with `error`).",
    )
    status: TaskStatus
    result: dict[str, Any] | None = None
    error: ErrorBody | None = None
    metrics: list[MetricPoint] = Field(
        default=[], description="Recorded on the task's job with the end (an evaluation's)."
    )

    @model_validator(mode="after")
    def _gave_up_fails(self) -> TaskEnd:
        if self.attempt is None and (self.status is not TaskStatus.failed or self.error is None):
            raise ValueError("a wait that gave up fails its task, saying why (error)")
        return self


class TaskEnded(LenientModel):
    ended: bool = Field(
        description="False: the attempt had lost its task (cancelled, or "
        "taken over), so nothing was recorded."
    )


class RunKey(LenientModel):
    """A key that acts for one job only, for the managed run on it (its SDK calls)."""

    secret: str
