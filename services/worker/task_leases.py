"""Background tasks, the worker's side: claim a task for one attempt, keep it alive, record
how the attempt ended. Every change is conditional on the attempt still owning the task, so a
worker that lost its task (cancelled, or taken over after its heartbeats stopped) changes
nothing. Data functions: they only flush, the caller owns the transaction (the worker's, or
the gateway's when the end also moves the gateway's rows: `record_end`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.common.columns import utcnow
from services.common.schemas import ErrorBody
from services.worker.models import BackgroundTaskRow
from services.worker.schemas import TaskKind
from services.worker.task_schemas import TaskEnd, TaskStatus
from services.worker.task_states import move_task


class ClaimAction(StrEnum):
    run = "run"  # this delivery runs the task, as attempt `attempt`
    skip = "skip"  # done, failed, cancelled or unknown: nothing left to do
    # Another delivery holds the task under a live lease (running it, or waiting for services
    # before its next attempt): this message is a duplicate, dropped.
    duplicate = "duplicate"


@dataclass(frozen=True)
class Claim:
    action: ClaimAction
    attempt: int = 0
    status: str = ""


def claim_task(
    session: Session,
    task_id: str,
    now: datetime,
    stale_after_s: float,
    *,
    resumes_wait: bool = False,
) -> Claim:
    """Decide what one delivery of the task's message does (idempotent on the task id).

    The lease is `heartbeat_at`, fresh for `stale_after_s`: refreshed by the attempt running
    the task, or, while it is queued, by the delivery chain waiting for services
    (`note_waiting`; moving to queued clears it). A message that meets a live lease is a
    duplicate (a broker's redelivery after its visibility timeout, a resend after a restart)
    and is dropped without counting an attempt, unless it is the waiting chain's own
    (`resumes_wait`: it carries the wait) and the wait is over. If the lease holder dies, its
    lease goes stale and the workers' sweep sends the task again (`requeue_abandoned`,
    `lost_waits`), so dropping a message never strands its task."""
    row = session.get(BackgroundTaskRow, task_id, with_for_update=True)
    if row is None:
        return Claim(ClaimAction.skip, status="missing")
    status = TaskStatus(row.status)
    live = _live(row, now, stale_after_s)
    if live and (
        status is TaskStatus.running or (status is TaskStatus.queued and not resumes_wait)
    ):
        return Claim(ClaimAction.duplicate, status=status.value)
    if status not in (TaskStatus.queued, TaskStatus.running):
        return Claim(ClaimAction.skip, status=status.value)
    move_task(row, TaskStatus.running, now)
    row.attempts += 1
    row.error = None  # the previous attempt's (or wait's): not this attempt's
    session.flush()
    return Claim(ClaimAction.run, attempt=row.attempts, status=status.value)


def _live(row: BackgroundTaskRow, now: datetime, lease_s: float) -> bool:
    return row.heartbeat_at is not None and (now - row.heartbeat_at).total_seconds() < lease_s


def _owned(session: Session, task_id: str, attempt: int) -> BackgroundTaskRow | None:
    row = session.get(BackgroundTaskRow, task_id, with_for_update=True)
    if row is None or row.status != TaskStatus.running.value or row.attempts != attempt:
        return None
    return row


def heartbeat(session: Session, task_id: str, attempt: int, now: datetime) -> bool:
    """Refresh the attempt's heartbeat; False when it no longer owns the task (stop work)."""
    row = _owned(session, task_id, attempt)
    if row is None:
        return False
    row.heartbeat_at = now
    session.flush()
    return True


def record_progress(session: Session, task_id: str, attempt: int, progress: dict[str, Any]) -> bool:
    """A managed run's newest checkpoint; False, and nothing written, if it lost the task."""
    row = _owned(session, task_id, attempt)
    if row is None:
        return False
    row.progress = progress
    session.flush()
    return True


def finish_attempt(
    session: Session,
    task_id: str,
    attempt: int,
    status: TaskStatus,
    now: datetime,
    *,
    result: dict[str, Any] | None = None,
    error: ErrorBody | None = None,
) -> bool:
    """Record how the attempt ended: succeeded (result), failed or cancelled (error), or
    queued again after an upstream outage (error: why). False, and nothing written, if it lost
    the task; True, and nothing written again, if this very end is recorded already (a
    re-sent `TaskEnd` whose answer was lost)."""
    errors = error.model_dump() if error is not None else None
    row = session.get(BackgroundTaskRow, task_id, with_for_update=True)
    if row is None or row.attempts != attempt:
        return False
    if (row.status, row.result, row.error) == (status.value, result, errors):
        return status is not TaskStatus.running
    if row.status != TaskStatus.running.value:
        return False
    move_task(row, status, now)
    row.result = result
    row.error = errors
    session.flush()
    return True


def record_end(session: Session, task_id: str, end: TaskEnd, now: datetime) -> bool:
    """`end` recorded: an attempt's (`finish_attempt`), or a wait's that gave up
    (`note_waiting`). Whether it ended the task as `end` says."""
    if end.attempt is None:
        assert end.error is not None  # a wait's end always says why
        return note_waiting(session, task_id, now, end.error, give_up=True)
    return finish_attempt(
        session, task_id, end.attempt, end.status, now, result=end.result, error=end.error
    )


def note_waiting(
    session: Session,
    task_id: str,
    now: datetime,
    error: ErrorBody,
    *,
    give_up: bool,
    lease_s: float | None = None,
) -> bool:
    """A queued task waiting for services to come back: say why (`error`), or, `give_up`,
    fail it with that. False, and nothing written, unless the task is still queued (a cancel
    meanwhile ends the wait) and, for a message that starts a wait (`lease_s`, the lease's
    length), no other delivery waits for it under a live lease (this one is a duplicate)."""
    row = session.get(BackgroundTaskRow, task_id, with_for_update=True)
    if row is None or row.status != TaskStatus.queued.value:
        return False
    if lease_s is not None and _live(row, now, lease_s):
        return False
    if give_up:
        move_task(row, TaskStatus.failed, now)
    else:
        row.heartbeat_at = now  # the wait's message is alive (`lost_waits`)
    row.error = error.model_dump()
    session.flush()
    return True


def lost_waits(session: Session, now: datetime, stale_after_s: float) -> list[BackgroundTaskRow]:
    """Tasks waiting for services whose wait stopped being noted `stale_after_s` ago: the
    worker holding their next message died (a broker without redelivery, such as the
    filesystem one, loses it). The caller sends them again once this commits."""
    cutoff = now - timedelta(seconds=stale_after_s)
    rows = list(
        session.scalars(
            select(BackgroundTaskRow)
            .where(
                BackgroundTaskRow.status == TaskStatus.queued.value,
                BackgroundTaskRow.heartbeat_at < cutoff,
            )
            .with_for_update(skip_locked=True)
        )
    )
    for row in rows:
        row.heartbeat_at = None
    session.flush()
    return rows


def progress_of(session: Session, task_id: str) -> dict[str, Any] | None:
    row = session.get(BackgroundTaskRow, task_id)
    return None if row is None else row.progress


def requeue_abandoned(
    session: Session, now: datetime, stale_after_s: float
) -> list[BackgroundTaskRow]:
    """Running tasks whose worker stopped heartbeating `stale_after_s` ago (killed, host
    lost): queued again, for the caller to send once this commits."""
    cutoff = now - timedelta(seconds=stale_after_s)
    rows = list(
        session.scalars(
            select(BackgroundTaskRow)
            .where(
                BackgroundTaskRow.status == TaskStatus.running.value,
                BackgroundTaskRow.heartbeat_at < cutoff,
            )
            .with_for_update(skip_locked=True)
        )
    )
    for row in rows:
        move_task(row, TaskStatus.queued, now)
        row.error = ErrorBody(
            code="worker_lost",
            message=(
                f"The worker running attempt {row.attempts} stopped (killed, or its host lost); "
                "queued again."
            ),
        ).model_dump()
    session.flush()
    return rows


def unsent_tasks(session: Session, now: datetime, older_than_s: float) -> list[BackgroundTaskRow]:
    """Tasks queued for `older_than_s`: their message may never have reached the broker (the
    gateway died between commit and send) or may be waiting behind others. Sending them
    again is safe, deliveries being idempotent, but it duplicates messages: a worker does it
    when it starts, not periodically."""
    cutoff = now - timedelta(seconds=older_than_s)
    return list(
        session.scalars(
            select(BackgroundTaskRow).where(
                BackgroundTaskRow.status == TaskStatus.queued.value,
                BackgroundTaskRow.created_at < cutoff,
            )
        )
    )


def ensure_task(
    session: Session, task_id: str, kind: TaskKind, job_id: str | None, params: dict[str, Any]
) -> None:
    """A queued task with this id unless one exists (for work whose message names its id,
    such as a scheduled collection)."""
    if session.get(BackgroundTaskRow, task_id) is None:
        session.add(
            BackgroundTaskRow(
                id=task_id,
                job_id=job_id,
                kind=kind.value,
                params=params,
                status=TaskStatus.queued.value,
                attempts=0,
                created_at=utcnow(),
            )
        )
        session.flush()
