"""One delivery of a task's message, start to end: claim the task in the worker's tables,
run its logic while a heartbeat keeps the claim alive (and notices a cancel), record the
outcome. Plain asyncio and data functions, no Celery: `tasks.py` adapts it. A delivery whose
services are not ready waits for them before claiming anything (see below).

A task's final end is recorded by its `Ending`: in the worker's own transaction, or, for a
task whose end moves the gateway's rows (a managed run's job, an evaluation's metrics), by
the gateway in one transaction with them (`gateway_ending`). If the gateway cannot be reached
then, the delivery fails: the task stays running until its lease goes stale, and the sweep
sends it again (a run resumes from its last checkpoint).

Faults follow the shared taxonomy: a user fault (a service's 4xx: bad version, unknown
verifier, ...) fails the task with that message; anything else that is not an outage is a bug,
logged and failed as an internal error. An outage (unreachable, 5xx, busy) queues the task
again, and what happens next depends on the stack's readiness (`readiness.py`):
- services not ready (restarting, a vLLM engine starting): the task waits for exactly those,
  without claiming it or counting a retry, for as long as LOOM_WORKER_OUTAGE_WINDOW_S, and
  says so on its row;
- every service ready, yet the attempt failed: a strike, tried again after a backoff, up to
  LOOM_WORKER_MAX_RETRIES strikes in a row. An attempt that made progress (a managed run that
  recorded a checkpoint) clears the strikes, so a long run survives any number of outages.
The message carries this state (`Outage`) from one delivery to the next."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from pydantic import BaseModel, ConfigDict
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from modelstate.client import ModelStateClient
from services.common.columns import utcnow
from services.common.db import in_transaction
from services.common.errors import LimitExceeded, LoomError, Unavailable, UpstreamError
from services.common.schemas import ErrorBody, MetricPoint
from services.common.service_token import client_of
from services.reward.client import RewardClient
from services.rollout.client import RolloutClient
from services.worker.gateway_calls import GatewayCalls
from services.worker.readiness import Readiness, stack_readiness
from services.worker.recipe_registry import RunStopped
from services.worker.settings import WorkerSettings
from services.worker.task_leases import (
    ClaimAction,
    claim_task,
    finish_attempt,
    heartbeat,
    note_waiting,
    progress_of,
    record_end,
)
from services.worker.task_schemas import TaskEnd, TaskStatus

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRYABLE = (Unavailable, UpstreamError, LimitExceeded)
# The database dropped a connection or is restarting: an outage too, never a bug of the task's.
DATABASE_DOWN = (OperationalError, InterfaceError)
MAX_BACKOFF_S = 300.0
WAIT_POLL_S = 2.0  # how often a waiting task looks at the services again


@dataclass
class Services:
    """Clients of the services a task may call; opened per delivery, on its event loop."""

    modelstate: ModelStateClient
    rollout: RolloutClient
    reward: RewardClient


@dataclass(frozen=True)
class Done:
    """What a task's logic produced; `metrics` go to the task's job in the transaction that
    marks the task succeeded (an evaluation's: its `Ending` is the gateway's), so both happen
    or neither."""

    result: BaseModel
    metrics: list[MetricPoint] = field(default_factory=list)


# Records a task's final end (succeeded, failed, cancelled; `TaskEnd`); False when the
# attempt had lost its task.
Ending = Callable[[str, TaskEnd], Awaitable[bool]]


def local_ending(sessions: sessionmaker[Session]) -> Ending:
    """The end recorded in the worker's own transaction: for tasks that move no gateway row."""

    async def end(task_id: str, task_end: TaskEnd) -> bool:
        if task_end.metrics:
            raise ValueError("metrics are the gateway's rows: end this task with gateway_ending")
        return await in_transaction(sessions, lambda s: record_end(s, task_id, task_end, utcnow()))

    return end


def gateway_ending(settings: WorkerSettings) -> Ending:
    """The end recorded by the gateway, with the rows of its own that move with it."""

    async def end(task_id: str, task_end: TaskEnd) -> bool:
        gateway = client_of(settings, GatewayCalls)
        try:
            return await gateway.end_task(task_id, task_end)
        finally:
            await gateway.aclose()

    return end


# A task's logic, given the services and its attempt number (a managed run names its
# checkpoints by attempt).
Work = Callable[[Services, int], Awaitable[Done]]


class Outage(BaseModel):
    """What a task's message carries between deliveries: `strikes`, attempts in a row that
    failed while every service was ready; `waiting_for`, the services it waits for, since
    `since` (wall-clock seconds)."""

    model_config = ConfigDict(frozen=True)

    strikes: int = 0
    waiting_for: tuple[str, ...] = ()
    since: float | None = None


@dataclass(frozen=True)
class Redeliver:
    """Send the message again after `after_s`, carrying `outage`."""

    after_s: float
    outage: Outage


class _Lost(Exception):
    """The attempt no longer owns its task: cancelled, or taken over by another worker."""


@contextlib.asynccontextmanager
async def open_services(settings: WorkerSettings) -> AsyncIterator[Services]:
    modelstate = ModelStateClient.from_settings(settings)
    rollout = client_of(settings, RolloutClient)
    reward = client_of(settings, RewardClient)
    try:
        yield Services(modelstate, rollout, reward)
    finally:
        for client in (modelstate, rollout, reward):
            await client.aclose()


async def run_delivery(
    settings: WorkerSettings,
    sessions: sessionmaker[Session],
    task_id: str,
    outage: Outage,
    work: Work,
    needs: tuple[str, ...],
    readiness: Readiness | None = None,
    ending: Ending | None = None,
) -> Redeliver | None:
    """Handle one delivery, `outage` being what the message carried; `needs`: the services
    the work calls (the ones an outage waits for); `ending` records the task's final end
    (default: `local_ending`). Returns when (if ever) the message must come again."""
    readiness = readiness or stack_readiness(settings)
    ending = ending or local_ending(sessions)
    # Services not ready (restarting, an engine starting): wait for them before claiming, so
    # no attempt is spent on them (after `loom up` restarts, the worker is often up first).
    still = await readiness(outage.waiting_for or needs)
    if still:
        return await _wait(settings, sessions, ending, task_id, outage, still)
    claim = await in_transaction(
        sessions,
        lambda s: claim_task(
            s, task_id, utcnow(), settings.stale_after_s, resumes_wait=bool(outage.waiting_for)
        ),
    )
    if claim.action is ClaimAction.skip:
        log.info("task %s is %s: nothing to do", task_id, claim.status)
        return None
    if claim.action is ClaimAction.duplicate:
        log.info(
            "task %s is %s under another delivery's live lease: duplicate message dropped",
            task_id,
            claim.status,
        )
        return None
    attempt = claim.attempt
    progress = await in_transaction(sessions, lambda s: progress_of(s, task_id))
    log.info("task %s: attempt %d", task_id, attempt)

    def end(status: TaskStatus, error: ErrorBody) -> Awaitable[bool]:
        if status is TaskStatus.queued:  # tried again: nothing but the task moves
            return in_transaction(
                sessions,
                lambda s: finish_attempt(s, task_id, attempt, status, utcnow(), error=error),
            )
        return ending(task_id, TaskEnd(attempt=attempt, status=status, error=error))

    try:
        async with open_services(settings) as services:
            done = await _with_heartbeat(
                sessions, task_id, attempt, settings.worker_heartbeat_s, work(services, attempt)
            )
    except _Lost:
        log.info("task %s: attempt %d stopped (cancelled or taken over)", task_id, attempt)
        return None
    except RunStopped as exc:
        log.info("task %s: attempt %d stopped: %s", task_id, attempt, exc)
        if exc.cancel_task:
            await end(TaskStatus.cancelled, ErrorBody(code="cancelled", message=str(exc)))
        return None
    except (*RETRYABLE, *DATABASE_DOWN) as caught:
        exc = (
            caught
            if isinstance(caught, LoomError)
            else Unavailable(f"The database is unavailable: {str(caught).splitlines()[0][:300]}")
        )
        progressed = await in_transaction(sessions, lambda s: progress_of(s, task_id)) != progress
        strikes = 0 if progressed else outage.strikes
        unready = await readiness(needs)
        if unready:
            log.warning("task %s: %s; waiting for %s", task_id, exc.message, ", ".join(unready))
            waiting = _waiting_error(exc, unready)

            def queue_and_note(session: Session) -> bool:  # one transaction for both
                return finish_attempt(
                    session, task_id, attempt, TaskStatus.queued, utcnow(), error=waiting
                ) and note_waiting(session, task_id, utcnow(), waiting, give_up=False)

            await in_transaction(sessions, queue_and_note)
            return Redeliver(
                WAIT_POLL_S, Outage(strikes=strikes, waiting_for=tuple(unready), since=time.time())
            )
        if strikes >= settings.worker_max_retries:
            await end(
                TaskStatus.failed,
                _error(
                    exc, f"gave up after {strikes} retries without progress, every service ready: "
                ),
            )
            return None
        delay = min(MAX_BACKOFF_S, settings.worker_retry_backoff_s * 2**strikes)
        log.warning("task %s: %s; trying again in %.1f s", task_id, exc.message, delay)
        await end(TaskStatus.queued, _error(exc))
        return Redeliver(delay, Outage(strikes=strikes + 1))
    except LoomError as exc:
        await end(TaskStatus.failed, _error(exc))
    except Exception as exc:
        log.exception("task %s failed", task_id)
        await end(
            TaskStatus.failed,
            ErrorBody(
                code="internal_error", message=f"Internal error: {type(exc).__name__}: {exc}"
            ),
        )
    else:
        if not await ending(
            task_id,
            TaskEnd(
                attempt=attempt,
                status=TaskStatus.succeeded,
                result=done.result.model_dump(mode="json"),
                metrics=done.metrics,
            ),
        ):
            log.info("task %s: finished, but cancelled meanwhile: result dropped", task_id)
    return None


async def _wait(
    settings: WorkerSettings,
    sessions: sessionmaker[Session],
    ending: Ending,
    task_id: str,
    outage: Outage,
    unready: dict[str, str],
) -> Redeliver | None:
    """Services the task waits for are still not ready: say so on its row and look again
    soon, or fail it once they have been gone for the whole outage window."""
    since = outage.since if outage.since is not None else time.time()
    waited = time.time() - since
    give_up = waited > settings.worker_outage_window_s
    what = _listed(unready)
    error = ErrorBody(
        code=Unavailable.code,
        detail={"waiting_for": unready, "waited_s": round(waited, 1)},
        message=(
            f"Gave up: services not ready for {waited:.0f} s "
            f"(LOOM_WORKER_OUTAGE_WINDOW_S={settings.worker_outage_window_s:g})"
            f": {what}"
            if give_up
            else f"Waiting for services: {what}"
        ),
    )
    if give_up:
        await ending(task_id, TaskEnd(attempt=None, status=TaskStatus.failed, error=error))
        return None
    # A message that starts a wait respects the lease of a delivery holding the task already.
    lease_s = None if outage.waiting_for else settings.stale_after_s
    if not await in_transaction(
        sessions,
        lambda s: note_waiting(s, task_id, utcnow(), error, give_up=False, lease_s=lease_s),
    ):
        return None  # cancelled, taken up, or held by another delivery: nothing left to do
    return Redeliver(
        WAIT_POLL_S, Outage(strikes=outage.strikes, waiting_for=tuple(unready), since=since)
    )


async def _with_heartbeat(
    sessions: sessionmaker[Session], task_id: str, attempt: int, every_s: float, work: Awaitable[T]
) -> T:
    """Await `work`, refreshing the claim every `every_s`; cancel it once the claim is lost,
    or when the heartbeat itself fails (the database dropped it): the attempt ends there, so
    its work must not go on calling services while the failure is handled."""
    running = asyncio.ensure_future(work)
    while True:
        finished, _ = await asyncio.wait({running}, timeout=every_s)
        if finished:
            return running.result()
        try:
            owned = await in_transaction(
                sessions, lambda s: heartbeat(s, task_id, attempt, utcnow())
            )
        except BaseException:
            await _cancel(running)
            raise
        if not owned:
            await _cancel(running)
            raise _Lost


async def _cancel(running: asyncio.Future[T]) -> None:
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await running


def _listed(unready: dict[str, str]) -> str:
    return "; ".join(f"{name}: {why}" for name, why in unready.items())


def _waiting_error(exc: LoomError, unready: dict[str, str]) -> ErrorBody:
    return ErrorBody(
        code=exc.code,
        message=f"{exc.message} (waiting for services: {_listed(unready)})",
        detail={"waiting_for": unready, "error": exc.detail},
    )


def _error(exc: LoomError, prefix: str = "") -> ErrorBody:
    return ErrorBody(code=exc.code, message=prefix + exc.message, detail=exc.detail)
