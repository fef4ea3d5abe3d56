"""Wire models of the gateway's own API: jobs, API keys, aggregated health."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import Field

from services.common.schemas import Health, LenientModel, StrictModel
from services.trainer.schemas import LoraConfig, TrainingMode


class JobStatus(StrEnum):
    created = "created"
    running = "running"
    completed = "completed"
    failed = "failed"


class JobCreate(StrictModel):
    name: str = Field(default="job", min_length=1, max_length=128)
    base_model: str = Field(min_length=1, max_length=1024)
    mode: TrainingMode = TrainingMode.lora
    lora: LoraConfig = LoraConfig()
    config: dict[str, Any] = Field(default={}, description="Free-form settings of the script")


class Job(LenientModel):
    id: str
    name: str
    base_model: str
    mode: TrainingMode
    lora: LoraConfig | None
    config: dict[str, Any]
    status: JobStatus
    created_at: datetime


class JobStatusUpdate(StrictModel):
    """Move a job to another status (checked against the job state machine)."""

    status: JobStatus


class JobList(LenientModel):
    jobs: list[Job]


class ApiKeyCreate(StrictModel):
    name: str = Field(min_length=1, max_length=128)
    admin: bool = False


class ApiKeyPublic(LenientModel):
    id: str
    name: str
    admin: bool
    prefix: str
    created_at: datetime
    revoked_at: datetime | None = None


class ApiKeyCreated(ApiKeyPublic):
    key: str = Field(description="The secret; shown once, stored only as a hash.")


class ApiKeyList(LenientModel):
    keys: list[ApiKeyPublic]


class StackHealth(LenientModel):
    status: str
    services: dict[str, Health]
