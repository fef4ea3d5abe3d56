"""Background tasks, the gateway's side: the data functions of the API (submit, read, cancel,
retry) and of the end the worker reports when it moves the gateway's rows (`end_task`). They
take a session and only flush; the caller owns the transaction. The tasks' tables and the
worker's side (claiming, heartbeats, outcomes) are the worker's: `services.worker.models`,
`services.worker.task_leases`."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.auth.keys import KeyIdentity, create_job_key, revoke_job_keys
from gateway.jobs.jobs import end_with_run, get_job_row, reopen_for_retry, visible_to
from gateway.jobs.logs import log_metrics
from gateway.models import JobRow, utcnow
from gateway.schemas import JobStatus
from services.common.errors import Conflict, LoomError, NotFound
from services.common.schemas import ErrorBody
from services.worker.models import BackgroundTaskRow
from services.worker.recipe_registry import load_recipe
from services.worker.schemas import RecipeParams, RunProgress, TaskKind
from services.worker.task_leases import record_end
from services.worker.task_schemas import (
    BackgroundTask,
    RecipeTaskCreate,
    RunKey,
    TaskCreate,
    TaskEnd,
    TaskEnded,
    TaskStatus,
)
from services.worker.task_states import move_task

MAX_LISTED = 1_000
RUN_KEY_NAME = "managed run"


def insert_task(
    session: Session, job_id: str | None, body: TaskCreate
) -> tuple[BackgroundTask, bool]:
    """A new queued task, or (same idempotency key) the one an earlier submit created."""
    params = body.params.model_dump(mode="json")
    if body.idempotency_key is not None:
        existing = session.scalar(
            select(BackgroundTaskRow).where(
                BackgroundTaskRow.job_id == job_id,
                BackgroundTaskRow.idempotency_key == body.idempotency_key,
            )
        )
        if existing is not None:
            if existing.kind != body.kind or existing.params != params:
                raise Conflict(
                    f"Idempotency key {body.idempotency_key!r} was used for another task "
                    f"({existing.id}, {existing.kind}) with other params.",
                    {"task_id": existing.id},
                )
            return to_public(existing), False
    if isinstance(body, RecipeTaskCreate) and job_id is not None:
        check_run(session, job_id, body.params)
    row = BackgroundTaskRow(
        job_id=job_id,
        kind=body.kind,
        params=params,
        status=TaskStatus.queued.value,
        attempts=0,
        idempotency_key=body.idempotency_key,
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return to_public(row), True


def check_run(session: Session, job_id: str, params: RecipeParams) -> None:
    """A managed run may start: its recipe exists and takes this config, and its job is live
    with no other run queued or running (two would train one model at once)."""
    load_recipe(params.recipe).parse_config(params.config)
    job = session.get(JobRow, job_id, with_for_update=True)  # serializes concurrent submits
    assert job is not None  # the caller found it
    if job.status not in (JobStatus.running.value, JobStatus.paused.value):
        raise Conflict(
            f"Job {job_id} is {job.status}; a recipe runs on a running job.",
            {"job_id": job_id, "status": job.status},
        )
    active = session.scalar(
        select(BackgroundTaskRow.id).where(
            BackgroundTaskRow.job_id == job_id,
            BackgroundTaskRow.kind == TaskKind.recipe.value,
            BackgroundTaskRow.status.in_([TaskStatus.queued.value, TaskStatus.running.value]),
        )
    )
    if active is not None:
        raise Conflict(
            f"Job {job_id} already has a run ({active}); cancel it or wait for it to end first.",
            {"job_id": job_id, "task_id": active},
        )


def end_task(session: Session, task_id: str, end: TaskEnd) -> TaskEnded:
    """The worker's `end` of a task recorded with what moves with it, in this transaction: a
    managed run's job ends (`end_with_run`), an evaluation's metrics are logged. An end
    recorded before (sent again after a lost answer) moves nothing again."""
    row = session.get(BackgroundTaskRow, task_id, with_for_update=True)
    before = row.status if row is not None else None
    ended = record_end(session, task_id, end, utcnow())
    if ended and row is not None and row.status != before:
        end_with_run(session, row)
        if end.metrics and row.job_id is not None:
            log_metrics(session, row.job_id, end.metrics)
    return TaskEnded(ended=ended)


def renew_run_key(session: Session, job_id: str) -> tuple[RunKey, list[str]]:
    """A key for the managed run on the job, replacing any earlier run key (a crashed
    attempt's, or this call's own whose answer was lost): the job has one live run key. With
    the ids of the keys it revoked."""
    if session.get(JobRow, job_id, with_for_update=True) is None:
        raise NotFound(f"No job {job_id!r}.")
    revoked = revoke_job_keys(session, job_id, RUN_KEY_NAME)
    return RunKey(secret=create_job_key(session, job_id, RUN_KEY_NAME)), revoked


def drop_run_key(session: Session, job_id: str) -> list[str]:
    """The run ended (or stopped): its key acts no more. The ids of the keys revoked."""
    return revoke_job_keys(session, job_id, RUN_KEY_NAME)


def get_task_row(
    session: Session, task_id: str, viewer: KeyIdentity, *, lock: bool = False
) -> BackgroundTaskRow:
    """A task the viewer may see: a task of one of its jobs (admins: every task)."""
    row = session.get(BackgroundTaskRow, task_id, with_for_update=lock)
    if row is None or not (viewer.admin or _owns_job_of(session, row, viewer)):
        raise NotFound(f"No task {task_id!r} (or it belongs to another API key).")
    return row


def _owns_job_of(session: Session, row: BackgroundTaskRow, viewer: KeyIdentity) -> bool:
    if row.job_id is None:  # store-wide (the scheduled gc): admins only
        return False
    try:
        get_job_row(session, row.job_id, viewer)
    except NotFound:
        return False
    return True


def list_tasks(
    session: Session, viewer: KeyIdentity, job_id: str | None = None, limit: int = 100
) -> list[BackgroundTask]:
    """Newest first: one job's tasks, or every task the viewer may see."""
    query = (
        select(BackgroundTaskRow)
        .order_by(BackgroundTaskRow.created_at.desc(), BackgroundTaskRow.id)
        .limit(limit)
    )
    if job_id is not None:
        get_job_row(session, job_id, viewer)
        query = query.where(BackgroundTaskRow.job_id == job_id)
    elif not viewer.admin:
        query = query.join(JobRow, JobRow.id == BackgroundTaskRow.job_id).where(visible_to(viewer))
    return [to_public(row) for row in session.scalars(query)]


def latest_run(session: Session, job_id: str) -> BackgroundTask | None:
    """The job's newest managed run (recipe task), whatever its status."""
    row = session.scalar(
        select(BackgroundTaskRow)
        .where(
            BackgroundTaskRow.job_id == job_id,
            BackgroundTaskRow.kind == TaskKind.recipe.value,
        )
        .order_by(BackgroundTaskRow.created_at.desc(), BackgroundTaskRow.id)
        .limit(1)
    )
    return to_public(row) if row is not None else None


def cancel_task(session: Session, task_id: str, viewer: KeyIdentity) -> BackgroundTask:
    """Cancel it (a managed run's job with it: `end_with_run`)."""
    row = get_task_row(session, task_id, viewer, lock=True)
    move_task(row, TaskStatus.cancelled, utcnow())
    session.flush()
    end_with_run(session, row)
    return to_public(row)


def requeue_failed(session: Session, task_id: str, viewer: KeyIdentity) -> BackgroundTask:
    """A failed task queued again (its attempts keep counting); the caller sends it. A
    managed run is retried only on a live job; the run that failed its job (`end_with_run`)
    reopens it (`reopen_for_retry`)."""
    row = get_task_row(session, task_id, viewer, lock=True)
    if row.kind == TaskKind.recipe.value and row.job_id is not None:
        reopen_for_retry(session, row)
        check_run(session, row.job_id, RecipeParams.model_validate(row.params))
    move_task(row, TaskStatus.queued, utcnow())
    row.result = row.error = None
    session.flush()
    return to_public(row)


def fail_undispatched(session: Session, task_id: str, exc: LoomError) -> BackgroundTask:
    """The broker did not take the task: it fails, visibly, instead of waiting forever."""
    row = session.get(BackgroundTaskRow, task_id, with_for_update=True)
    if row is None:
        raise NotFound(f"No task {task_id!r}.")
    move_task(row, TaskStatus.failed, utcnow())
    row.error = ErrorBody(code=exc.code, message=exc.message, detail=exc.detail).model_dump()
    session.flush()
    return to_public(row)


def to_public(row: BackgroundTaskRow) -> BackgroundTask:
    return BackgroundTask(
        id=row.id,
        job_id=row.job_id,
        kind=TaskKind(row.kind),
        params=row.params,
        status=TaskStatus(row.status),
        result=row.result,
        error=ErrorBody.model_validate(row.error) if row.error else None,
        attempts=row.attempts,
        idempotency_key=row.idempotency_key,
        created_at=row.created_at,
        progress=RunProgress.model_validate(row.progress) if row.progress else None,
        started_at=row.started_at,
        finished_at=row.finished_at,
    )
