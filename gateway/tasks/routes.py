"""Background tasks of jobs (gc, evaluate, export, managed runs), run by the Celery worker,
and the internal routes the worker calls for the gateway's rows (service token). Routes
parse, call, return: submitting is `dispatch`, the rows are `tasks`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from gateway.auth.deps import CurrentKey, ServiceCaller
from gateway.auth.middleware import AuthCache
from gateway.deps import AuthCacheDep, CeleryDep, SessionDep, SessionsDep
from gateway.tasks import dispatch, tasks
from services.worker.task_schemas import (
    BackgroundTask,
    BackgroundTaskList,
    RunKey,
    TaskCreate,
    TaskEnd,
    TaskEnded,
)

router = APIRouter(prefix="/v1", tags=["tasks"])
Limit = Annotated[int, Query(ge=1, le=tasks.MAX_LISTED)]


@router.post(
    "/jobs/{job_id}/tasks",
    response_model=BackgroundTask,
    status_code=status.HTTP_202_ACCEPTED,
    responses={
        200: {"model": BackgroundTask, "description": "Submitted before with this idempotency key."}
    },
)
async def submit_task(
    job_id: str,
    body: TaskCreate,
    key: CurrentKey,
    sessions: SessionsDep,
    celery: CeleryDep,
    response: Response,
) -> BackgroundTask:
    """Queue a task at once; poll `GET /v1/tasks/{id}` for its result. 503 (and the task
    marked failed) when the broker is unreachable."""
    task, created = await dispatch.submit(sessions, celery, job_id, body, key)
    if not created:
        response.status_code = status.HTTP_200_OK
    return task


@router.get("/jobs/{job_id}/tasks", response_model=BackgroundTaskList)
def list_job_tasks(
    job_id: str, key: CurrentKey, session: SessionDep, limit: Limit = 100
) -> BackgroundTaskList:
    return BackgroundTaskList(tasks=tasks.list_tasks(session, key, job_id, limit))


@router.get("/tasks", response_model=BackgroundTaskList)
def list_tasks(key: CurrentKey, session: SessionDep, limit: Limit = 100) -> BackgroundTaskList:
    """Every task the key may see, newest first (admins: store-wide ones too)."""
    return BackgroundTaskList(tasks=tasks.list_tasks(session, key, None, limit))


@router.get("/tasks/{task_id}", response_model=BackgroundTask)
def get_task(task_id: str, key: CurrentKey, session: SessionDep) -> BackgroundTask:
    return tasks.to_public(tasks.get_task_row(session, task_id, key))


@router.post("/tasks/{task_id}/cancel", response_model=BackgroundTask)
def cancel_task(task_id: str, key: CurrentKey, session: SessionDep) -> BackgroundTask:
    """A queued task never runs; a running one stops at its next heartbeat."""
    return tasks.cancel_task(session, task_id, key)


@router.post(
    "/tasks/{task_id}/retry", response_model=BackgroundTask, status_code=status.HTTP_202_ACCEPTED
)
async def retry_task(
    task_id: str, key: CurrentKey, sessions: SessionsDep, celery: CeleryDep
) -> BackgroundTask:
    """Queue a failed task again (409 for any other status)."""
    return await dispatch.retry(sessions, celery, task_id, key)


@router.put("/internal/tasks/{task_id}/end", response_model=TaskEnded)
def end_task(task_id: str, body: TaskEnd, _caller: ServiceCaller, session: SessionDep) -> TaskEnded:
    """The worker's end of a task whose end moves the gateway's rows (a managed run's job,
    an evaluation's metrics), recorded with them; a repeat records nothing twice."""
    return tasks.end_task(session, task_id, body)


@router.put("/internal/jobs/{job_id}/run-key", response_model=RunKey)
def renew_run_key(
    job_id: str, _caller: ServiceCaller, session: SessionDep, cache: AuthCacheDep
) -> RunKey:
    """A key acting for the job only, for the managed run the worker starts on it; it
    replaces the job's earlier run key."""
    key, revoked = tasks.renew_run_key(session, job_id)
    _evict(cache, revoked)
    return key


@router.delete("/internal/jobs/{job_id}/run-key", status_code=204)
def drop_run_key(
    job_id: str, _caller: ServiceCaller, session: SessionDep, cache: AuthCacheDep
) -> Response:
    _evict(cache, tasks.drop_run_key(session, job_id))
    return Response(status_code=204)


def _evict(cache: AuthCache, key_ids: list[str]) -> None:
    """Revoked here: they act no more at once, not after the cache's time."""
    for key_id in key_ids:
        cache.evict(key_id)
