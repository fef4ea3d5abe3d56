"""One delivery of a task's message, start to end: claim the task in the gateway's database,
run its logic while a heartbeat keeps the claim alive (and notices a cancel), record the
outcome. Plain asyncio and data functions, no Celery: `tasks.py` adapts it.

Faults follow the shared taxonomy: a user fault (a service's 4xx: bad version, unknown
verifier, ...) fails the task with that message; an upstream outage (unreachable, 5xx, busy)
queues it again after a backoff, a bounded number of times; anything else is a bug, logged and
failed as an internal error."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel
from sqlalchemy.orm import Session, sessionmaker

from agents.recipes.run import RunStopped
from gateway.models import utcnow
from gateway.task_leases import ClaimAction, claim_task, finish_attempt, heartbeat
from gateway.task_schemas import TaskStatus
from modelstate.client import ModelStateClient
from services.common.db import in_transaction
from services.common.errors import LimitExceeded, LoomError, Unavailable, UpstreamError
from services.common.http import ServiceClient
from services.common.schemas import ErrorBody
from services.common.service_token import service_client
from services.worker.settings import WorkerSettings

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRYABLE = (Unavailable, UpstreamError, LimitExceeded)
MAX_BACKOFF_S = 300.0


@dataclass
class Services:
    """Clients of the services a task may call; opened per delivery, on its event loop."""

    modelstate: ModelStateClient
    rollout: ServiceClient
    reward: ServiceClient


@dataclass(frozen=True)
class Done:
    """What a task's logic produced; `record` writes more rows in the transaction that marks
    the task succeeded (an evaluation's metrics), so both happen or neither."""

    result: BaseModel
    record: Callable[[Session], object] | None = None


# A task's logic, given the services and its attempt number (a managed run names its
# checkpoints by attempt).
Work = Callable[[Services, int], Awaitable[Done]]


@dataclass(frozen=True)
class Redeliver:
    """Send the message again after `after_s`; `counts`: as a retry after an outage."""

    after_s: float
    counts: bool


class _Lost(Exception):
    """The attempt no longer owns its task: cancelled, or taken over by another worker."""


@contextlib.asynccontextmanager
async def open_services(settings: WorkerSettings) -> AsyncIterator[Services]:
    modelstate = ModelStateClient.from_settings(settings)
    rollout = service_client(settings, "rollout")
    reward = service_client(settings, "reward")
    try:
        yield Services(modelstate, rollout, reward)
    finally:
        for client in (modelstate, rollout, reward):
            await client.aclose()


async def run_delivery(settings: WorkerSettings, sessions: sessionmaker[Session],
                       task_id: str, retries: int, work: Work) -> Redeliver | None:
    """Handle one delivery; `retries`: outage retries this message already had. Returns
    when (if ever) the message must come again."""
    claim = await in_transaction(sessions, lambda s: claim_task(s, task_id, utcnow(),
                                                     settings.stale_after_s))
    if claim.action is ClaimAction.skip:
        log.info("task %s is %s: nothing to do", task_id, claim.status)
        return None
    if claim.action is ClaimAction.wait:
        log.info("task %s is running elsewhere: looking again in %.1f s", task_id, claim.wait_s)
        return Redeliver(claim.wait_s + 0.5, counts=False)
    attempt = claim.attempt
    log.info("task %s: attempt %d", task_id, attempt)

    def end(status: TaskStatus, error: ErrorBody) -> Awaitable[bool]:
        return in_transaction(sessions, lambda s: finish_attempt(
            s, task_id, attempt, status, utcnow(), error=error))

    try:
        async with open_services(settings) as services:
            done = await _with_heartbeat(sessions, task_id, attempt,
                                         settings.worker_heartbeat_s, work(services, attempt))
    except _Lost:
        log.info("task %s: attempt %d stopped (cancelled or taken over)", task_id, attempt)
        return None
    except RunStopped as exc:
        log.info("task %s: attempt %d stopped: %s", task_id, attempt, exc)
        if exc.cancel_task:
            await end(TaskStatus.cancelled, ErrorBody(code="cancelled", message=str(exc)))
        return None
    except RETRYABLE as exc:
        if retries < settings.worker_max_retries:
            delay = min(MAX_BACKOFF_S, settings.worker_retry_backoff_s * 2**retries)
            log.warning("task %s: %s; trying again in %.1f s", task_id, exc.message, delay)
            await end(TaskStatus.queued, _error(exc))
            return Redeliver(delay, counts=True)
        await end(TaskStatus.failed, _error(exc, f"gave up after {retries} retries: "))
    except LoomError as exc:
        await end(TaskStatus.failed, _error(exc))
    except Exception as exc:
        log.exception("task %s failed", task_id)
        await end(TaskStatus.failed, ErrorBody(
            code="internal_error", message=f"Internal error: {type(exc).__name__}: {exc}"))
    else:
        def succeed(session: Session) -> bool:
            ended = finish_attempt(session, task_id, attempt, TaskStatus.succeeded, utcnow(),
                                   result=done.result.model_dump(mode="json"))
            if ended and done.record is not None:
                done.record(session)
            return ended

        if not await in_transaction(sessions, succeed):
            log.info("task %s: finished, but cancelled meanwhile: result dropped", task_id)
    return None


async def _with_heartbeat(sessions: sessionmaker[Session], task_id: str, attempt: int,
                          every_s: float, work: Awaitable[T]) -> T:
    """Await `work`, refreshing the claim every `every_s`; cancel it once the claim is lost."""
    running = asyncio.ensure_future(work)
    while True:
        finished, _ = await asyncio.wait({running}, timeout=every_s)
        if finished:
            return running.result()
        if not await in_transaction(sessions, lambda s: heartbeat(s, task_id, attempt, utcnow())):
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await running
            raise _Lost


def _error(exc: LoomError, prefix: str = "") -> ErrorBody:
    return ErrorBody(code=exc.code, message=prefix + exc.message, detail=exc.detail)

