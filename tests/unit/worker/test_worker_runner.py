"""One delivery of a task (`runner.run_delivery`) over a real SQLite gateway database, with
plain coroutines standing in for the tasks' logic: outcomes, retries, idempotency, cancel,
takeover of a lost worker's task, and recovery of lost ones."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel
from sqlalchemy.orm import Session, sessionmaker

from agents.recipes import RunStopped
from gateway.app import ALEMBIC_DIR, VERSION_TABLE
from gateway.job_logs import log_metrics, metric_series
from gateway.keys import KeyIdentity
from gateway.models import BackgroundTaskRow, JobRow, utcnow
from gateway.schemas import MetricPoint
from gateway.task_leases import (
    ClaimAction,
    claim_task,
    finish_attempt,
    requeue_abandoned,
    unsent_tasks,
)
from gateway.task_schemas import GcTaskCreate, TaskStatus
from gateway.tasks import cancel_task, insert_task
from services.common.db import make_sessionmaker, transaction
from services.common.errors import InvalidInput, UpstreamError
from services.worker.runner import Done, Redeliver, Services, run_delivery
from services.worker.settings import WorkerSettings
from tests.conftest import migrated_engine

ADMIN = KeyIdentity(id="key_admin", name="admin", admin=True)


class Result(BaseModel):
    value: int


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    for engine in migrated_engine(f"sqlite:///{tmp_path / 'gateway.db'}", ALEMBIC_DIR,
                                  VERSION_TABLE):
        yield make_sessionmaker(engine)


@pytest.fixture
def settings(tmp_path: Path) -> WorkerSettings:
    return WorkerSettings(data_dir=tmp_path, worker_heartbeat_s=0.05, worker_max_retries=2,
                          worker_retry_backoff_s=1.0)


def new_task(sessions: sessionmaker[Session]) -> str:
    with transaction(sessions) as session:
        job = JobRow(name="j", base_model="m", mode="lora", config={}, status="running")
        session.add(job)
        session.flush()
        task, _ = insert_task(session, job.id, GcTaskCreate(kind="gc"))
        return task.id


def row(sessions: sessionmaker[Session], task_id: str) -> BackgroundTaskRow:
    with sessions() as session:
        found = session.get(BackgroundTaskRow, task_id)
        assert found is not None
        return found


async def test_success_records_the_result_and_the_extra_rows_in_one_transaction(
        sessions: sessionmaker[Session], settings: WorkerSettings) -> None:
    task_id = new_task(sessions)
    job_id = row(sessions, task_id).job_id
    assert job_id is not None
    calls = 0

    async def work(_services: Services, _attempt: int) -> Done:
        nonlocal calls
        calls += 1
        points = [MetricPoint(step=3, name="eval/heldout/accuracy", value=0.5)]
        return Done(Result(value=7), record=lambda s: log_metrics(s, job_id, points))

    assert await run_delivery(settings, sessions, task_id, 0, work) is None
    done = row(sessions, task_id)
    assert (done.status, done.result, done.error, done.attempts) == ("succeeded", {"value": 7},
                                                                      None, 1)
    with sessions() as session:
        [series] = metric_series(session, job_id)
    assert (series.name, series.steps, series.values) == ("eval/heldout/accuracy", [3], [0.5])

    # The same message again (redelivery, duplicate send): nothing runs, nothing changes.
    assert await run_delivery(settings, sessions, task_id, 0, work) is None
    again = row(sessions, task_id)
    assert (calls, again.attempts, again.finished_at) == (1, 1, done.finished_at)


async def test_a_user_fault_fails_at_once_and_a_bug_is_an_internal_error(
        sessions: sessionmaker[Session], settings: WorkerSettings) -> None:
    for exc, code in ((InvalidInput("no such verifier 'x'"), "invalid_input"),
                      (ValueError("oops"), "internal_error")):
        task_id = new_task(sessions)

        async def work(_services: Services, _attempt: int, exc: Exception = exc) -> Done:
            raise exc

        assert await run_delivery(settings, sessions, task_id, 0, work) is None
        failed = row(sessions, task_id)
        assert (failed.status, failed.error["code"]) == ("failed", code)  # type: ignore[index]


async def test_an_outage_is_retried_with_backoff_then_given_up(
        sessions: sessionmaker[Session], settings: WorkerSettings) -> None:
    task_id = new_task(sessions)

    async def work(_services: Services, _attempt: int) -> Done:
        raise UpstreamError("rollout: engine crashed")

    assert await run_delivery(settings, sessions, task_id, 0, work) == Redeliver(1.0, True)
    waiting = row(sessions, task_id)
    assert (waiting.status, waiting.error["message"]) == (  # type: ignore[index]
        "queued", "rollout: engine crashed")
    assert await run_delivery(settings, sessions, task_id, 1, work) == Redeliver(2.0, True)
    assert await run_delivery(settings, sessions, task_id, 2, work) is None
    failed = row(sessions, task_id)
    assert (failed.status, failed.attempts) == ("failed", 3)
    assert failed.error["message"] == (  # type: ignore[index]
        "gave up after 2 retries: rollout: engine crashed")


async def test_cancel_stops_a_running_task_at_its_next_heartbeat(
        sessions: sessionmaker[Session], settings: WorkerSettings) -> None:
    task_id = new_task(sessions)
    started, stopped = asyncio.Event(), asyncio.Event()

    async def work(_services: Services, _attempt: int) -> Done:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            stopped.set()
            raise
        return Done(Result(value=1))

    delivery = asyncio.create_task(run_delivery(settings, sessions, task_id, 0, work))
    await started.wait()
    with transaction(sessions) as session:
        assert cancel_task(session, task_id, ADMIN).status is TaskStatus.cancelled
    assert await asyncio.wait_for(delivery, 5) is None
    assert stopped.is_set()
    cancelled = row(sessions, task_id)
    assert (cancelled.status, cancelled.result, cancelled.attempts) == ("cancelled", None, 1)


async def test_a_lost_workers_task_waits_then_is_taken_over_and_recovered(
        sessions: sessionmaker[Session], settings: WorkerSettings) -> None:
    task_id = new_task(sessions)
    now = utcnow()
    with transaction(sessions) as session:  # attempt 1 starts, then its worker goes silent
        first = claim_task(session, task_id, now, settings.stale_after_s)
    assert (first.action, first.attempt) == (ClaimAction.run, 1)

    async def work(_services: Services, _attempt: int) -> Done:
        return Done(Result(value=2))

    again = await run_delivery(settings, sessions, task_id, 0, work)  # heartbeat still fresh
    assert again is not None and not again.counts and 0 < again.after_s <= 0.7
    later = now + timedelta(seconds=settings.stale_after_s + 0.1)
    with transaction(sessions) as session:
        takeover = claim_task(session, task_id, later, settings.stale_after_s)
        assert (takeover.action, takeover.attempt) == (ClaimAction.run, 2)
        # The first attempt wakes up: it owns nothing any more, its outcome is dropped.
        assert not finish_attempt(session, task_id, 1, TaskStatus.succeeded, later, result={})

    much_later = later + timedelta(seconds=10)
    with transaction(sessions) as session:  # attempt 2's worker is lost too: requeued, sent
        assert [r.id for r in requeue_abandoned(session, much_later, 1.0)] == [task_id]
        assert requeue_abandoned(session, much_later, 1.0) == []
        assert [r.id for r in unsent_tasks(session, much_later, 1.0)] == [task_id]
        assert unsent_tasks(session, utcnow(), 60.0) == []
    requeued = row(sessions, task_id)
    assert (requeued.status, requeued.error["code"]) == (  # type: ignore[index]
        "queued", "worker_lost")
    assert await run_delivery(settings, sessions, task_id, 0, work) is None
    assert (row(sessions, task_id).status, row(sessions, task_id).attempts) == ("succeeded", 3)


async def test_a_run_stopped_by_its_job_cancels_the_task_and_one_that_lost_it_writes_nothing(
        sessions: sessionmaker[Session], settings: WorkerSettings) -> None:
    for cancel_task_too, status in ((True, TaskStatus.cancelled), (False, TaskStatus.running)):
        task_id = new_task(sessions)

        async def work(_services: Services, attempt: int, cancel: bool = cancel_task_too
                       ) -> Done:
            assert attempt == 1
            raise RunStopped("Job was cancelled.", cancel_task=cancel)

        assert await run_delivery(settings, sessions, task_id, 0, work) is None
        stopped = row(sessions, task_id)
        assert (stopped.status, stopped.result) == (status.value, None)
        if cancel_task_too:
            assert stopped.error == {"code": "cancelled", "message": "Job was cancelled.",
                                     "detail": None}
