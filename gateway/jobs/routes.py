"""Jobs: created, listed, moved between states, and the metrics and samples their scripts log.
Routes parse, call, return."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

from gateway.auth.deps import CurrentKey
from gateway.deps import SessionDep, SessionsDep, SettingsDep, TrainerDep
from gateway.jobs import jobs
from gateway.jobs import logs as job_logs
from gateway.schemas import (
    Job,
    JobCreate,
    JobList,
    JobMetrics,
    JobSamples,
    JobStatusUpdate,
    LoggedCount,
    MetricsLog,
    SamplesLog,
)
from services.trainer.schemas import ModelInfo

router = APIRouter(prefix="/v1")


@router.post("/jobs", response_model=Job, status_code=status.HTTP_201_CREATED, tags=["jobs"])
async def create_job(
    body: JobCreate, key: CurrentKey, sessions: SessionsDep, trainer: TrainerDep
) -> Job:
    return await jobs.create_job(sessions, trainer, body, key)


@router.get("/jobs", response_model=JobList, tags=["jobs"])
def list_jobs(key: CurrentKey, session: SessionDep) -> JobList:
    return JobList(jobs=jobs.list_jobs(session, key))


@router.get("/jobs/{job_id}", response_model=Job, tags=["jobs"])
def get_job(job_id: str, key: CurrentKey, session: SessionDep) -> Job:
    return jobs.get_job(session, job_id, key)


@router.post("/jobs/{job_id}/status", response_model=Job, tags=["jobs"])
def set_job_status(job_id: str, body: JobStatusUpdate, key: CurrentKey, session: SessionDep) -> Job:
    return jobs.set_status(session, job_id, body.status, key)


@router.post("/jobs/{job_id}/model", response_model=ModelInfo, tags=["jobs"])
async def ensure_model(
    job_id: str, key: CurrentKey, sessions: SessionsDep, trainer: TrainerDep
) -> ModelInfo:
    """The job's trainer model, created again if the trainer lost it (after a restart)."""
    return await jobs.ensure_model(sessions, trainer, job_id, key)


@router.post("/jobs/{job_id}/metrics", response_model=LoggedCount, tags=["jobs"])
def log_metrics(job_id: str, body: MetricsLog, key: CurrentKey, session: SessionDep) -> LoggedCount:
    """Record metric points; a point sent again (same name and step) replaces its value."""
    job = jobs.get_job_row(session, job_id, key)
    return LoggedCount(job_id=job.id, accepted=job_logs.log_metrics(session, job.id, body.points))


@router.get("/jobs/{job_id}/metrics", response_model=JobMetrics, tags=["jobs"])
def get_metrics(
    job_id: str,
    key: CurrentKey,
    session: SessionDep,
    name: Annotated[list[str] | None, Query(description="Only these metrics (repeatable).")] = None,
    since_step: Annotated[
        int | None, Query(ge=-1, description="Only steps after this one.")
    ] = None,
) -> JobMetrics:
    job = jobs.get_job_row(session, job_id, key)
    return JobMetrics(
        job_id=job.id, series=job_logs.metric_series(session, job.id, name, since_step)
    )


@router.post("/jobs/{job_id}/samples", response_model=LoggedCount, tags=["jobs"])
def log_samples(
    job_id: str, body: SamplesLog, key: CurrentKey, session: SessionDep, settings: SettingsDep
) -> LoggedCount:
    """Keep trajectories for inspection; the job holds only its newest ones."""
    job = jobs.get_job_row(session, job_id, key)
    accepted = job_logs.log_samples(
        session, job.id, body.samples, keep=settings.gateway_samples_kept_per_job
    )
    return LoggedCount(job_id=job.id, accepted=accepted)


@router.get("/jobs/{job_id}/samples", response_model=JobSamples, tags=["jobs"])
def get_samples(
    job_id: str,
    key: CurrentKey,
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=1_000)] = 50,
) -> JobSamples:
    job = jobs.get_job_row(session, job_id, key)
    return JobSamples(job_id=job.id, samples=job_logs.recent_samples(session, job.id, limit))
