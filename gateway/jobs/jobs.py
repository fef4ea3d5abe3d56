"""Jobs: a row in the gateway's database plus the model the trainer builds for it.

Creating a job inserts the row (`created`), then asks the trainer for the model. If the trainer
refuses (4xx) its error goes back to the caller unchanged; if it fails or cannot be reached the
caller gets 502/503. Either way the job is marked `failed` and the error names its id, so a
failed attempt stays visible in `GET /v1/jobs` instead of vanishing.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, select, true
from sqlalchemy.orm import Session, sessionmaker

from gateway.auth.keys import KeyIdentity
from gateway.jobs.logs import progress
from gateway.jobs.states import TRANSITIONS, move_job, reopen_job
from gateway.models import JobRow
from gateway.schemas import Job, JobCreate, JobProgress, JobStatus
from services.common.db import in_transaction
from services.common.errors import Conflict, Forbidden, LoomError, NotFound
from services.trainer.client import TrainerClient
from services.trainer.schemas import CreateModelRequest, LoraConfig, ModelInfo, TrainingMode
from services.worker.models import BackgroundTaskRow
from services.worker.schemas import TaskKind
from services.worker.task_schemas import TaskStatus

# How a managed run that ended for good ends its job.
_JOB_AFTER_RUN = {
    TaskStatus.succeeded: JobStatus.completed,
    TaskStatus.failed: JobStatus.failed,
    TaskStatus.cancelled: JobStatus.cancelled,
}


def insert_job(session: Session, body: JobCreate, owner: KeyIdentity) -> JobRow:
    if owner.job_id is not None:
        raise Forbidden(
            f"API key {owner.name!r} is a job key: it acts for job {owner.job_id} "
            "only and cannot create jobs; use your own key."
        )
    lora = body.lora.model_dump() if body.mode == TrainingMode.lora else None
    row = JobRow(
        name=body.name,
        base_model=body.base_model,
        mode=body.mode.value,
        lora=lora,
        config=body.config,
        status=JobStatus.created.value,
        owner_key_id=owner.id,
    )
    session.add(row)
    session.flush()
    return row


def get_job_row(session: Session, job_id: str, viewer: KeyIdentity) -> JobRow:
    """A job the viewer may see: admins see every job, other keys their own."""
    row = session.get(JobRow, job_id)
    if row is None or not viewer.sees_job(row.id, row.owner_key_id):
        raise NotFound(f"No job {job_id!r} (or it belongs to another API key).")
    return row


def visible_to(viewer: KeyIdentity) -> ColumnElement[bool]:
    """The jobs `viewer` may see, as a filter (`KeyIdentity.sees_job` for queries)."""
    if viewer.job_id is not None:
        return JobRow.id == viewer.job_id
    return true() if viewer.admin else JobRow.owner_key_id == viewer.id


class JobOwners:
    """Answers "does this key own this job?" for the proxy's hot path. Owners never change,
    so a yes is remembered (bounded); a no is asked again, since the job may be new."""

    def __init__(self, sessions: sessionmaker[Session], max_entries: int = 100_000) -> None:
        self.sessions = sessions
        self.max_entries = max_entries
        self._owned: set[tuple[str, str]] = set()

    async def check(self, key: KeyIdentity, job_id: str) -> None:
        """NotFound unless `key` may act on `job_id` (the same answer as `get_job_row`)."""
        if key.admin or (key.id, job_id) in self._owned:
            return

        await in_transaction(self.sessions, lambda s: get_job_row(s, job_id, key))
        if len(self._owned) >= self.max_entries:
            self._owned.clear()
        self._owned.add((key.id, job_id))


def list_jobs(session: Session, viewer: KeyIdentity) -> list[Job]:
    query = select(JobRow).where(visible_to(viewer)).order_by(JobRow.created_at.desc(), JobRow.id)
    rows = list(session.scalars(query))
    steps = progress(session, (row.id for row in rows))
    return [to_public(row, steps.get(row.id)) for row in rows]


def get_job(session: Session, job_id: str, viewer: KeyIdentity) -> Job:
    row = get_job_row(session, job_id, viewer)
    return to_public(row, progress(session, [row.id]).get(row.id))


def set_status(session: Session, job_id: str, status: JobStatus, viewer: KeyIdentity) -> Job:
    row = get_job_row(session, job_id, viewer)
    move_job(row, status)
    session.flush()
    return get_job(session, job_id, viewer)


def end_with_run(session: Session, task: BackgroundTaskRow) -> None:
    """A managed run (a `recipe` task) that ended for good ends its job the same way:
    succeeded → `completed`, failed → `failed`, cancelled → `cancelled`, so the admin stops
    showing a finished run's job as running. Call it where the task reaches that status.

    A job may host several runs, one after another (`tasks.check_run` refuses a second while
    one is queued or running), so the rule for a shared job is: the first run that ends for
    good *after starting* (at least one attempt) ends the job, and with it the job's runs (a
    later submit, or a retry of the failed run, is refused: the job is no longer live). A run
    that never started (cancelled while queued, or refused by the broker) trained nothing and
    leaves its job as it was. Other tasks (evaluations, exports, collections) never move their
    job, nor does a run whose job was moved meanwhile (paused, or ended by its owner) when
    the state machine does not allow the move (a paused job does not become `completed`)."""
    target = _JOB_AFTER_RUN.get(TaskStatus(task.status))
    if (
        target is None
        or task.kind != TaskKind.recipe.value
        or task.job_id is None
        or task.attempts == 0
    ):
        return
    job = session.get(JobRow, task.job_id, with_for_update=True)
    if job is not None and target in TRANSITIONS[JobStatus(job.status)]:
        move_job(job, target)
        session.flush()


def reopen_for_retry(session: Session, task: BackgroundTaskRow) -> None:
    """Retrying the managed run that failed its job reopens the job (`failed` → `running`):
    an operator's retry after an outage resumes the run from its last checkpoint, as retries
    did before runs ended their jobs. Only that run, and only while it is the job's latest:
    a job failed any other way (by its script, or at creation) stays failed."""
    if (
        task.kind != TaskKind.recipe.value
        or task.job_id is None
        or task.attempts == 0
        or task.status != TaskStatus.failed.value
    ):
        return
    job = session.get(JobRow, task.job_id, with_for_update=True)
    latest = session.scalar(
        select(BackgroundTaskRow.id)
        .where(
            BackgroundTaskRow.job_id == task.job_id, BackgroundTaskRow.kind == TaskKind.recipe.value
        )
        .order_by(BackgroundTaskRow.created_at.desc(), BackgroundTaskRow.id.desc())
        .limit(1)
    )
    if job is not None and job.status == JobStatus.failed.value and latest == task.id:
        reopen_job(job)
        session.flush()


async def create_job(
    sessions: sessionmaker[Session], trainer: TrainerClient, body: JobCreate, owner: KeyIdentity
) -> Job:
    job = await in_transaction(sessions, lambda s: to_public(insert_job(s, body, owner)))
    request = CreateModelRequest(
        job_id=job.id, base_model=body.base_model, mode=body.mode, lora=body.lora
    )
    try:
        await trainer.create_model(request)
    except LoomError as exc:
        await in_transaction(sessions, lambda s: set_status(s, job.id, JobStatus.failed, owner))
        raise type(exc)(
            f"Job {job.id} failed: the trainer could not create its model: {exc.message}",
            {"job_id": job.id, "trainer": exc.detail},
        ) from exc
    return await in_transaction(sessions, lambda s: set_status(s, job.id, JobStatus.running, owner))


async def ensure_model(
    sessions: sessionmaker[Session], trainer: TrainerClient, job_id: str, viewer: KeyIdentity
) -> ModelInfo:
    """The trainer's model of a live job, built again from the job's row if the trainer lost
    it (a restart): the step to take before `load_state` resumes from a checkpoint."""
    job = await in_transaction(sessions, lambda s: to_public(get_job_row(s, job_id, viewer)))
    if job.status not in (JobStatus.running, JobStatus.paused):
        raise Conflict(
            f"Job {job_id} is {job.status.value}; only a running or paused job "
            "has a trainer model.",
            {"job_id": job_id, "status": job.status.value},
        )
    request = CreateModelRequest(
        job_id=job.id, base_model=job.base_model, mode=job.mode, lora=job.lora or LoraConfig()
    )
    return await trainer.create_model(request)


def to_public(row: JobRow, job_progress: JobProgress | None = None) -> Job:
    return Job(
        id=row.id,
        name=row.name,
        base_model=row.base_model,
        mode=TrainingMode(row.mode),
        lora=LoraConfig(**row.lora) if row.lora is not None else None,
        config=row.config,
        status=JobStatus(row.status),
        created_at=row.created_at,
        progress=job_progress,
    )
