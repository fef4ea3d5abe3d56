"""Submitting background tasks: the row commits first, then the message goes to the broker,
so a worker never receives a task it cannot find. If the broker cannot be reached the task is
marked failed and the caller gets 503: nothing the API acknowledged is silently lost (and
`retry` sends it again later)."""

from __future__ import annotations

from celery import Celery
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from gateway.auth.keys import KeyIdentity
from gateway.jobs.jobs import get_job_row
from gateway.tasks import tasks
from services.common.db import in_transaction
from services.common.errors import Unavailable
from services.worker.app import send
from services.worker.task_schemas import BackgroundTask, TaskCreate


async def submit(
    sessions: sessionmaker[Session],
    celery: Celery,
    job_id: str,
    body: TaskCreate,
    viewer: KeyIdentity,
) -> tuple[BackgroundTask, bool]:
    """The task (queued and sent), and whether this call created it: a submit repeated with
    the same idempotency key returns the first one's task."""

    def insert(session: Session) -> tuple[BackgroundTask, bool]:
        get_job_row(session, job_id, viewer)
        return tasks.insert_task(session, job_id, body)

    try:
        task, created = await in_transaction(sessions, insert)
    except IntegrityError:  # the same key, submitted concurrently: the other insert won
        task, created = await in_transaction(sessions, insert)
    if created:
        task = await _dispatch(sessions, celery, task)
    return task, created


async def retry(
    sessions: sessionmaker[Session], celery: Celery, task_id: str, viewer: KeyIdentity
) -> BackgroundTask:
    """A failed task queued and sent again."""
    task = await in_transaction(sessions, lambda s: tasks.requeue_failed(s, task_id, viewer))
    return await _dispatch(sessions, celery, task)


async def _dispatch(
    sessions: sessionmaker[Session], celery: Celery, task: BackgroundTask
) -> BackgroundTask:
    try:
        await run_in_threadpool(send, celery, task.id, task.kind, task.job_id, task.params)
    except Unavailable as exc:
        unsent = exc
        await in_transaction(sessions, lambda s: tasks.fail_undispatched(s, task.id, unsent))
        raise
    return task
