"""Wire models shared by every service and the SDK."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# Job ids and the other ids that appear in paths: one pattern, so none of them can spell a path
# of its own ('..', '/', '%').
RESOURCE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class StrictModel(BaseModel):
    """Request bodies: unknown fields are a client mistake, so reject them."""

    model_config = ConfigDict(extra="forbid")


class LenientModel(BaseModel):
    """Responses: ignore fields a newer server adds, so old clients keep working."""

    model_config = ConfigDict(extra="ignore")


# Metric names: `reward`, `loss`, `eval/accuracy`, `throughput/samples_per_s`, ...
METRIC_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_./:-]{0,127}$"


class MetricPoint(StrictModel):
    """One value of a job's metric at one step (the gateway's job metrics; the worker's
    evaluations record theirs through the gateway)."""

    step: int = Field(ge=0, le=2**62)
    name: str = Field(pattern=METRIC_NAME_PATTERN)
    value: float = Field(allow_inf_nan=False)


class ErrorBody(LenientModel):
    code: str
    message: str
    detail: Any = None


class ErrorEnvelope(LenientModel):
    error: ErrorBody


class Health(LenientModel):
    service: str
    status: str
    version: str
    detail: dict[str, Any] = {}


class OperationStatus(StrEnum):
    pending = "pending"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"


class Operation(LenientModel):
    """Long work: submitted at once, executed in order, polled until it is done."""

    id: str
    kind: str
    status: OperationStatus
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    result: Any = None
    error: ErrorBody | None = None

    @property
    def done(self) -> bool:
        return self.status in (OperationStatus.succeeded, OperationStatus.failed)
