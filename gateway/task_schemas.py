"""Wire models of background tasks (`/v1/jobs/{job}/tasks`, `/v1/tasks`): what to submit and
what a task looks like. Each kind's params and result are in `services/worker/schemas.py`."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field

from services.common.schemas import ErrorBody, LenientModel, StrictModel
from services.worker.schemas import (
    EvaluateParams,
    ExportParams,
    GcParams,
    RecipeParams,
    RunProgress,
    TaskKind,
)

IdempotencyKey = Annotated[str | None, Field(
    default=None, min_length=1, max_length=128,
    description="Submitting again with the same key (for the same job) returns the task the "
    "first submit created instead of a new one.")]


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


TaskCreate = Annotated[GcTaskCreate | EvaluateTaskCreate | ExportTaskCreate | RecipeTaskCreate,
                       Field(discriminator="kind")]


class BackgroundTask(LenientModel):
    id: str
    job_id: str | None = Field(description="None for store-wide work (the scheduled gc).")
    kind: TaskKind
    params: dict[str, Any]
    status: TaskStatus
    result: dict[str, Any] | None = None
    error: ErrorBody | None = Field(
        default=None, description="Why it failed; on a queued task, the upstream outage it "
        "waits out before its next attempt.")
    attempts: int = Field(description="Times a worker started it.")
    progress: RunProgress | None = Field(
        default=None, description="A recipe run: its newest checkpoint, where it resumes.")
    idempotency_key: str | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def done(self) -> bool:
        return self.status in (TaskStatus.succeeded, TaskStatus.failed, TaskStatus.cancelled)


class BackgroundTaskList(LenientModel):
    tasks: list[BackgroundTask]
