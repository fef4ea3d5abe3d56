"""One delivery of a task (`runner.run_delivery`) over a real SQLite gateway database, with
plain coroutines standing in for the tasks' logic: outcomes, retries, idempotency, cancel,
takeover of a lost worker's task, and recovery of lost ones."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from agents.recipes import RunStopped
from gateway.auth.keys import KeyIdentity
from gateway.jobs.logs import metric_series
from gateway.models import JobRow, utcnow
from gateway.tasks.tasks import cancel_task, end_task, insert_task
from services.common.db import in_transaction, transaction
from services.common.errors import InvalidInput, UpstreamError
from services.common.schemas import MetricPoint
from services.worker.models import BackgroundTaskRow
from services.worker.readiness import Readiness
from services.worker.runner import (
    WAIT_POLL_S,
    Done,
    Ending,
    Outage,
    Redeliver,
    Services,
    Work,
    local_ending,
    run_delivery,
)
from services.worker.settings import WorkerSettings
from services.worker.task_leases import (
    ClaimAction,
    claim_task,
    finish_attempt,
    lost_waits,
    record_progress,
    requeue_abandoned,
    unsent_tasks,
)
from services.worker.task_schemas import GcTaskCreate, TaskEnd, TaskStatus
from tests.support.task_tables import task_sessions

NEEDS = ("rollout", "trainer")
ADMIN = KeyIdentity(id="key_admin", name="admin", admin=True)


class Result(BaseModel):
    value: int


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    yield from task_sessions(f"sqlite:///{tmp_path / 'gateway.db'}")


@pytest.fixture
def settings(tmp_path: Path) -> WorkerSettings:
    return WorkerSettings(
        data_dir=tmp_path, worker_heartbeat_s=0.05, worker_max_retries=2, worker_retry_backoff_s=1.0
    )


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


def gateway_side(sessions: sessionmaker[Session]) -> Ending:
    """What `PUT /v1/internal/tasks/{id}/end` does, in process: the gateway's `end_task`."""

    async def end(task_id: str, task_end: TaskEnd) -> bool:
        return await in_transaction(sessions, lambda s: end_task(s, task_id, task_end).ended)

    return end


async def test_success_records_the_result_and_the_jobs_metrics_in_one_transaction(
    sessions: sessionmaker[Session], settings: WorkerSettings
) -> None:
    task_id = new_task(sessions)
    job_id = row(sessions, task_id).job_id
    assert job_id is not None
    calls = 0

    async def work(_services: Services, _attempt: int) -> Done:
        nonlocal calls
        calls += 1
        return Done(
            Result(value=7), metrics=[MetricPoint(step=3, name="eval/heldout/accuracy", value=0.5)]
        )

    assert (
        await run_delivery(
            settings, sessions, task_id, Outage(), work, NEEDS, ending=gateway_side(sessions)
        )
        is None
    )
    done = row(sessions, task_id)
    assert (done.status, done.result, done.error, done.attempts) == (
        "succeeded",
        {"value": 7},
        None,
        1,
    )
    with sessions() as session:
        [series] = metric_series(session, job_id)
    assert (series.name, series.steps, series.values) == ("eval/heldout/accuracy", [3], [0.5])

    # The same message again (redelivery, duplicate send): nothing runs, nothing changes.
    assert await run_delivery(settings, sessions, task_id, Outage(), work, NEEDS) is None
    again = row(sessions, task_id)
    assert (calls, again.attempts, again.finished_at) == (1, 1, done.finished_at)


async def test_an_end_sent_again_after_a_lost_answer_is_recorded_once(
    sessions: sessionmaker[Session],
) -> None:
    task_id = new_task(sessions)
    with transaction(sessions) as session:
        assert claim_task(session, task_id, utcnow(), 60.0).attempt == 1
        job = session.get(JobRow, row(sessions, task_id).job_id)
        assert job is not None
        job_id = job.id
    end = TaskEnd(
        attempt=1,
        status=TaskStatus.succeeded,
        result={"value": 1},
        metrics=[MetricPoint(step=1, name="eval/x/accuracy", value=1.0)],
    )
    gateway = gateway_side(sessions)
    assert await gateway(task_id, end)
    first = row(sessions, task_id)
    assert await gateway(task_id, end)  # the same end again: acknowledged, nothing moves
    again = row(sessions, task_id)
    assert (again.status, again.finished_at) == ("succeeded", first.finished_at)
    with sessions() as session:
        [series] = metric_series(session, job_id)
    assert series.values == [1.0]
    # Another end of that attempt is not the same end: the attempt no longer holds the task.
    assert not await gateway(task_id, end.model_copy(update={"status": TaskStatus.failed}))
    with pytest.raises(ValueError, match="metrics are the gateway's rows"):
        await local_ending(sessions)(task_id, end)


async def test_a_user_fault_fails_at_once_and_a_bug_is_an_internal_error(
    sessions: sessionmaker[Session], settings: WorkerSettings
) -> None:
    for exc, code in (
        (InvalidInput("no such verifier 'x'"), "invalid_input"),
        (ValueError("oops"), "internal_error"),
    ):
        task_id = new_task(sessions)

        async def work(_services: Services, _attempt: int, exc: Exception = exc) -> Done:
            raise exc

        assert await run_delivery(settings, sessions, task_id, Outage(), work, NEEDS) is None
        failed = row(sessions, task_id)
        assert (failed.status, failed.error["code"]) == ("failed", code)  # type: ignore[index]


def services_ready(unready: dict[str, str] | None = None) -> Readiness:
    """A stack whose not-ready services are `unready` (changed by the test as it goes)."""
    state = unready if unready is not None else {}

    async def probe(names: tuple[str, ...]) -> dict[str, str]:
        return {name: why for name, why in state.items() if name in names}

    return probe


@pytest.fixture(autouse=True)
def stack_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """No services here: the stack counts as ready unless a test passes its own readiness."""
    monkeypatch.setattr("services.worker.runner.stack_readiness", lambda _: services_ready())


async def test_failures_with_every_service_ready_are_strikes_then_given_up(
    sessions: sessionmaker[Session], settings: WorkerSettings
) -> None:
    task_id = new_task(sessions)
    ready = services_ready()

    async def work(_services: Services, _attempt: int) -> Done:
        raise UpstreamError("rollout: engine crashed")

    first = await run_delivery(settings, sessions, task_id, Outage(), work, NEEDS, ready)
    assert first == Redeliver(1.0, Outage(strikes=1))
    waiting = row(sessions, task_id)
    assert (waiting.status, waiting.error["message"]) == (  # type: ignore[index]
        "queued",
        "rollout: engine crashed",
    )
    second = await run_delivery(settings, sessions, task_id, first.outage, work, NEEDS, ready)
    assert second == Redeliver(2.0, Outage(strikes=2))
    assert (
        await run_delivery(settings, sessions, task_id, second.outage, work, NEEDS, ready) is None
    )
    failed = row(sessions, task_id)
    assert (failed.status, failed.attempts) == ("failed", 3)
    assert failed.error["message"] == (  # type: ignore[index]
        "gave up after 2 retries without progress, every service ready: rollout: engine crashed"
    )


async def test_a_task_waits_for_services_that_are_not_ready_without_counting_or_claiming(
    sessions: sessionmaker[Session], settings: WorkerSettings
) -> None:
    task_id = new_task(sessions)
    unready: dict[str, str] = {}
    stack = services_ready(unready)
    outcomes = [UpstreamError("rollout: engine is still starting"), None]

    async def work(_services: Services, _attempt: int) -> Done:
        failure = outcomes.pop(0)
        if failure is not None:
            unready["rollout"] = "starting"  # it went down during the attempt
            raise failure
        return Done(Result(value=1))

    again = await run_delivery(settings, sessions, task_id, Outage(strikes=1), work, NEEDS, stack)
    assert again is not None and again.after_s == WAIT_POLL_S
    assert (again.outage.strikes, again.outage.waiting_for) == (1, ("rollout",))
    message = row(sessions, task_id).error["message"]  # type: ignore[index]
    assert "waiting for services: rollout: starting" in message
    for _ in range(3):  # still starting: no attempt is made, the row says why
        again = await run_delivery(settings, sessions, task_id, again.outage, work, NEEDS, stack)
        assert again is not None and again.outage.waiting_for == ("rollout",)
        waiting = row(sessions, task_id)
        assert (waiting.status, waiting.attempts) == ("queued", 1)
        assert waiting.error == {  # type: ignore[comparison-overlap]
            "code": "unavailable",
            "message": "Waiting for services: rollout: starting",
            "detail": waiting.error["detail"],
        }  # type: ignore[index]
    unready.clear()
    assert await run_delivery(settings, sessions, task_id, again.outage, work, NEEDS, stack) is None
    done = row(sessions, task_id)
    assert (done.status, done.attempts, done.result) == ("succeeded", 2, {"value": 1})


async def test_duplicate_messages_count_no_attempt_while_a_delivery_holds_the_lease(
    sessions: sessionmaker[Session], settings: WorkerSettings
) -> None:
    """A broker's redelivery (visibility timeout) or a resend after a restart, while the task
    runs or waits for services under another delivery's lease: dropped, nothing counted."""
    settings = settings.model_copy(update={"worker_heartbeat_s": 30.0})
    task_id = new_task(sessions)
    unready = {"rollout": "starting"}
    stack = services_ready(unready)
    ran: list[int] = []

    async def work(_services: Services, attempt: int) -> Done:
        ran.append(attempt)
        assert (
            await run_delivery(settings, sessions, task_id, Outage(), work, NEEDS, stack) is None
        )  # redelivered while this attempt runs
        return Done(Result(value=attempt))

    # Services not ready: the first delivery waits before claiming; no attempt is spent.
    wait = await run_delivery(settings, sessions, task_id, Outage(), work, NEEDS, stack)
    assert wait is not None and wait.outage.waiting_for == ("rollout",)
    for duplicate in (Outage(), Outage(strikes=3)):  # the wait's lease is live: dropped
        assert (
            await run_delivery(settings, sessions, task_id, duplicate, work, NEEDS, stack) is None
        )
    waiting = row(sessions, task_id)
    assert (waiting.status, waiting.attempts, ran) == ("queued", 0, [])
    unready.clear()  # the waiting chain's own message goes on, and runs attempt 1 alone
    assert await run_delivery(settings, sessions, task_id, wait.outage, work, NEEDS, stack) is None
    done = row(sessions, task_id)
    assert (done.status, done.attempts, done.result, ran) == ("succeeded", 1, {"value": 1}, [1])


async def test_a_wait_longer_than_the_outage_window_fails_the_task(
    sessions: sessionmaker[Session], settings: WorkerSettings
) -> None:
    task_id = new_task(sessions)
    outage = Outage(waiting_for=("trainer",), since=time.time() - 1000)

    async def work(_services: Services, _attempt: int) -> Done:
        raise AssertionError("never runs while the trainer is down")

    stack = services_ready({"trainer": "unreachable at http://127.0.0.1:8004"})
    assert (
        await run_delivery(
            settings.model_copy(update={"worker_outage_window_s": 900}),
            sessions,
            task_id,
            outage,
            work,
            NEEDS,
            stack,
        )
        is None
    )
    failed = row(sessions, task_id)
    assert (failed.status, failed.attempts) == ("failed", 0)
    assert failed.error["message"].startswith(  # type: ignore[index]
        "Gave up: services not ready for 1000 s (LOOM_WORKER_OUTAGE_WINDOW_S=900): trainer"
    )


async def test_progress_clears_the_strikes(
    sessions: sessionmaker[Session], settings: WorkerSettings
) -> None:
    task_id = new_task(sessions)

    async def work(_services: Services, attempt: int) -> Done:
        await in_transaction(
            sessions, lambda s: record_progress(s, task_id, attempt, {"step": attempt})
        )
        raise UpstreamError("modelstate: restarting")

    again = await run_delivery(
        settings, sessions, task_id, Outage(strikes=2), work, NEEDS, services_ready()
    )
    assert again == Redeliver(1.0, Outage(strikes=1))  # would have been given up at 2
    assert row(sessions, task_id).status == "queued"


async def test_a_cancel_ends_the_wait(
    sessions: sessionmaker[Session], settings: WorkerSettings
) -> None:
    task_id = new_task(sessions)
    with transaction(sessions) as session:
        cancel_task(session, task_id, ADMIN)

    async def work(_services: Services, _attempt: int) -> Done:
        raise AssertionError("a cancelled task never runs")

    outage = Outage(waiting_for=("rollout",), since=time.time())
    stack = services_ready({"rollout": "starting"})
    assert await run_delivery(settings, sessions, task_id, outage, work, NEEDS, stack) is None
    assert row(sessions, task_id).status == "cancelled"


def runs_until_cancelled(started: asyncio.Event, stopped: asyncio.Event) -> Work:
    """A task's logic that sets `started`, then waits until cancelled, setting `stopped`."""

    async def work(_services: Services, _attempt: int) -> Done:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            stopped.set()
            raise
        return Done(Result(value=1))

    return work


async def test_cancel_stops_a_running_task_at_its_next_heartbeat(
    sessions: sessionmaker[Session], settings: WorkerSettings
) -> None:
    task_id = new_task(sessions)
    started, stopped = asyncio.Event(), asyncio.Event()
    work = runs_until_cancelled(started, stopped)
    delivery = asyncio.create_task(run_delivery(settings, sessions, task_id, Outage(), work, NEEDS))
    await started.wait()
    with transaction(sessions) as session:
        assert cancel_task(session, task_id, ADMIN).status is TaskStatus.cancelled
    assert await asyncio.wait_for(delivery, 5) is None
    assert stopped.is_set()
    cancelled = row(sessions, task_id)
    assert (cancelled.status, cancelled.result, cancelled.attempts) == ("cancelled", None, 1)


async def test_a_lost_workers_task_is_taken_over_and_recovered(
    sessions: sessionmaker[Session], settings: WorkerSettings
) -> None:
    task_id = new_task(sessions)
    now = utcnow()
    with transaction(sessions) as session:  # attempt 1 starts, then its worker goes silent
        first = claim_task(session, task_id, now, settings.stale_after_s)
    assert (first.action, first.attempt) == (ClaimAction.run, 1)

    async def work(_services: Services, _attempt: int) -> Done:
        return Done(Result(value=2))

    # The heartbeat is still fresh: a duplicate message, dropped (the sweep sends the task
    # again should its lease go stale).
    assert await run_delivery(settings, sessions, task_id, Outage(strikes=1), work, NEEDS) is None
    assert (row(sessions, task_id).status, row(sessions, task_id).attempts) == ("running", 1)
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
        "queued",
        "worker_lost",
    )
    assert await run_delivery(settings, sessions, task_id, Outage(), work, NEEDS) is None
    assert (row(sessions, task_id).status, row(sessions, task_id).attempts) == ("succeeded", 3)


async def test_a_run_stopped_by_its_job_cancels_the_task_and_one_that_lost_it_writes_nothing(
    sessions: sessionmaker[Session], settings: WorkerSettings
) -> None:
    for cancel_task_too, status in ((True, TaskStatus.cancelled), (False, TaskStatus.running)):
        task_id = new_task(sessions)

        async def work(_services: Services, attempt: int, cancel: bool = cancel_task_too) -> Done:
            assert attempt == 1
            raise RunStopped("Job was cancelled.", cancel_task=cancel)

        assert await run_delivery(settings, sessions, task_id, Outage(), work, NEEDS) is None
        stopped = row(sessions, task_id)
        assert (stopped.status, stopped.result) == (status.value, None)
        if cancel_task_too:
            assert stopped.error == {
                "code": "cancelled",
                "message": "Job was cancelled.",
                "detail": None,
            }


async def test_a_dropped_database_connection_is_an_outage_not_a_bug(
    sessions: sessionmaker[Session], settings: WorkerSettings
) -> None:
    task_id = new_task(sessions)

    async def work(_services: Services, _attempt: int) -> Done:
        raise OperationalError("SELECT 1", {}, Exception("server closed the connection"))

    again = await run_delivery(settings, sessions, task_id, Outage(), work, NEEDS, services_ready())
    assert again == Redeliver(1.0, Outage(strikes=1))
    queued = row(sessions, task_id)
    assert queued.status == "queued" and queued.error is not None
    assert queued.error["code"] == "unavailable"
    assert queued.error["message"].startswith("The database is unavailable")


async def test_a_heartbeat_the_database_dropped_stops_the_work_before_the_outage_is_handled(
    sessions: sessionmaker[Session], settings: WorkerSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    task_id = new_task(sessions)
    stopped = asyncio.Event()
    work = runs_until_cancelled(asyncio.Event(), stopped)

    def dropped(*_args: object) -> bool:
        raise OperationalError("UPDATE", {}, Exception("server closed the connection"))

    work_stopped_at_probe: list[bool] = []  # before the claim, then once the attempt failed

    async def ready(_names: tuple[str, ...]) -> dict[str, str]:
        work_stopped_at_probe.append(stopped.is_set())
        return {}

    monkeypatch.setattr("services.worker.runner.heartbeat", dropped)
    again = await run_delivery(settings, sessions, task_id, Outage(), work, NEEDS, ready)
    assert again == Redeliver(1.0, Outage(strikes=1))
    assert work_stopped_at_probe == [False, True]
    assert row(sessions, task_id).status == "queued"


async def test_a_wait_whose_message_died_with_its_worker_is_sent_again(
    sessions: sessionmaker[Session], settings: WorkerSettings
) -> None:
    """A broker without redelivery (the filesystem one) loses the next message of a task that
    waits when the worker holding it dies: the sweep finds the wait gone silent."""
    task_id = new_task(sessions)

    async def work(_services: Services, _attempt: int) -> Done:
        raise UpstreamError("modelstate: restarting")

    stack = services_ready({"modelstate": "unreachable"})
    again = await run_delivery(
        settings, sessions, task_id, Outage(), work, NEEDS + ("modelstate",), stack
    )
    assert again is not None and again.outage.waiting_for == ("modelstate",)
    noted = row(sessions, task_id).heartbeat_at
    assert noted is not None
    with transaction(sessions) as session:  # still being noted: nothing to send
        assert lost_waits(session, utcnow(), settings.stale_after_s) == []
    later = utcnow() + timedelta(seconds=settings.stale_after_s + 1)
    with transaction(sessions) as session:  # its worker died: nobody notes it any more
        assert [r.id for r in lost_waits(session, later, settings.stale_after_s)] == [task_id]
    with transaction(sessions) as session:  # sent once
        assert lost_waits(session, later, settings.stale_after_s) == []
