"""Wire models of the gateway's own API: jobs, API keys, aggregated health, rollout replicas."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import Field, field_validator

from services.common.schemas import Health, LenientModel, MetricPoint, StrictModel
from services.trainer.schemas import LoraConfig, TrainingMode


class JobStatus(StrEnum):
    created = "created"
    running = "running"
    paused = "paused"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"


MAX_METRIC_POINTS = 10_000
MAX_LOGGED_SAMPLES = 1_000
MAX_SAMPLE_TEXT = 32_768


# Experiment trackers a job's metrics can be mirrored to (gateway.trackers).
TRACKER_NAMES = ("wandb", "mlflow", "tensorboard")


def parse_trackers(value: object) -> tuple[str, ...]:
    """`["wandb", "mlflow"]` or `"wandb,mlflow"` as tracker names; ValueError for others."""
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise ValueError("trackers: a list of names or a comma-separated string")
    chosen = tuple(dict.fromkeys(n.strip() for n in names if n.strip()))
    unknown = [n for n in chosen if n not in TRACKER_NAMES]
    if unknown:
        raise ValueError(f"unknown trackers {unknown}; known: {', '.join(TRACKER_NAMES)}")
    return chosen


def job_trackers(config: dict[str, Any]) -> tuple[str, ...] | None:
    """The trackers a job's config names (`{"trackers": [...]}`), or None: the default."""
    return parse_trackers(config["trackers"]) if "trackers" in config else None


class JobCreate(StrictModel):
    name: str = Field(default="job", min_length=1, max_length=128)
    base_model: str = Field(min_length=1, max_length=1024)
    mode: TrainingMode = TrainingMode.lora
    lora: LoraConfig = LoraConfig()
    config: dict[str, Any] = Field(
        default={},
        description="Free-form settings of the script; `trackers` (a list of "
        f"{', '.join(TRACKER_NAMES)}) mirrors the job's metrics to them ([] for none) instead "
        "of LOOM_TRACKERS",
    )

    @field_validator("config")
    @classmethod
    def _known_trackers(cls, config: dict[str, Any]) -> dict[str, Any]:
        job_trackers(config)
        return config


class JobProgress(LenientModel):
    """The newest metric step of the phase a job logged last (`sft/loss` is phase `sft`; each
    phase counts its own steps), and when it last logged: what a dashboard shows as progress."""

    step: int
    phase: str | None = Field(default=None, description="None: names without a phase prefix")
    updated_at: datetime


class Job(LenientModel):
    id: str
    name: str
    base_model: str
    mode: TrainingMode
    lora: LoraConfig | None
    config: dict[str, Any]
    status: JobStatus
    created_at: datetime
    progress: JobProgress | None = None


class JobStatusUpdate(StrictModel):
    """Move a job to another status (checked against the job state machine)."""

    status: JobStatus


class JobList(LenientModel):
    jobs: list[Job]


class MetricsLog(StrictModel):
    """Metrics of a job. A point sent again (same step and name) replaces the earlier value,
    so a retried request never double-counts."""

    points: list[MetricPoint] = Field(min_length=1, max_length=MAX_METRIC_POINTS)


class MetricSeries(LenientModel):
    name: str
    steps: list[int]
    values: list[float]


class JobMetrics(LenientModel):
    job_id: str
    series: list[MetricSeries]


class SampleRecord(StrictModel):
    """One trajectory kept for inspection (the job keeps a bounded number of the newest)."""

    step: int = Field(ge=0, le=2**62)
    version: int | None = Field(default=None, ge=0)
    prompt: str = Field(max_length=MAX_SAMPLE_TEXT)
    completion: str = Field(max_length=MAX_SAMPLE_TEXT)
    reward: float | None = Field(default=None, allow_inf_nan=False)


class SamplesLog(StrictModel):
    samples: list[SampleRecord] = Field(min_length=1, max_length=MAX_LOGGED_SAMPLES)


class LoggedSample(SampleRecord):
    model_config = LenientModel.model_config
    id: int
    created_at: datetime


class JobSamples(LenientModel):
    job_id: str
    samples: list[LoggedSample]


class LoggedCount(LenientModel):
    job_id: str
    accepted: int


class ApiKeyCreate(StrictModel):
    name: str = Field(min_length=1, max_length=128)
    admin: bool = False


class ApiKeyPublic(LenientModel):
    id: str
    name: str
    admin: bool
    job_id: str | None = Field(
        default=None, description="A job key: it acts for this one job only."
    )
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
