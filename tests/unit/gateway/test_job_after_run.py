"""A managed run that ends for good ends its job (`gateway.jobs.jobs.end_with_run`): only a run
that started, only a recipe task, only by a move the job's state machine allows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gateway.jobs.jobs import end_with_run, reopen_for_retry
from gateway.models import JobRow, utcnow
from services.common.db import transaction
from services.worker.models import BackgroundTaskRow
from tests.support.task_tables import task_sessions


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    yield from task_sessions(f"sqlite:///{tmp_path / 'gateway.db'}")


def job_after(
    sessions: sessionmaker[Session], *, job: str, kind: str, task: str, attempts: int
) -> str:
    """The job's status after a task of `kind` ended `task` with `attempts` attempts."""
    with transaction(sessions) as session:
        row = JobRow(name="j", base_model="m", mode="lora", config={}, status=job)
        session.add(row)
        session.flush()
        ended = BackgroundTaskRow(
            job_id=row.id, kind=kind, params={}, status=task, attempts=attempts, created_at=utcnow()
        )
        session.add(ended)
        session.flush()
        end_with_run(session, ended)
        return row.status


@pytest.mark.parametrize(
    ("task", "job"),
    [
        ("succeeded", "completed"),
        ("failed", "failed"),
        ("cancelled", "cancelled"),
        ("queued", "running"),
        ("running", "running"),
    ],
)
def test_a_started_run_ends_its_running_job_the_same_way(
    sessions: sessionmaker[Session], task: str, job: str
) -> None:
    assert job_after(sessions, job="running", kind="recipe", task=task, attempts=1) == job


def test_what_never_started_or_is_not_a_run_leaves_the_job(sessions: sessionmaker[Session]) -> None:
    assert (
        job_after(sessions, job="running", kind="recipe", task="cancelled", attempts=0) == "running"
    )
    for kind in ("evaluate", "export", "gc"):
        assert job_after(sessions, job="running", kind=kind, task="failed", attempts=1) == "running"


def test_a_job_moved_meanwhile_moves_only_where_its_states_allow(
    sessions: sessionmaker[Session],
) -> None:
    assert (
        job_after(sessions, job="paused", kind="recipe", task="succeeded", attempts=2) == "paused"
    )
    assert job_after(sessions, job="paused", kind="recipe", task="failed", attempts=2) == "failed"
    assert (
        job_after(sessions, job="cancelled", kind="recipe", task="cancelled", attempts=1)
        == "cancelled"
    )
    assert (
        job_after(sessions, job="completed", kind="recipe", task="failed", attempts=1)
        == "completed"
    )


def job_after_retry(
    sessions: sessionmaker[Session], *, job: str, runs: list[tuple[str, int]], retried: int
) -> str:
    """The job's status after the run `runs[retried]` (status, attempts) is retried."""
    with transaction(sessions) as session:
        row = JobRow(name="j", base_model="m", mode="lora", config={}, status=job)
        session.add(row)
        session.flush()
        tasks = [
            BackgroundTaskRow(
                job_id=row.id,
                kind="recipe",
                params={},
                status=status,
                attempts=attempts,
                created_at=utcnow(),
            )
            for status, attempts in runs
        ]
        for task in tasks:
            session.add(task)
            session.flush()
        reopen_for_retry(session, tasks[retried])
        return row.status


def test_retrying_the_run_that_failed_its_job_reopens_the_job(
    sessions: sessionmaker[Session],
) -> None:
    assert job_after_retry(sessions, job="failed", runs=[("failed", 1)], retried=0) == "running"
    assert (
        job_after_retry(sessions, job="failed", runs=[("succeeded", 1), ("failed", 3)], retried=1)
        == "running"
    )


def test_a_job_failed_any_other_way_stays_failed(sessions: sessionmaker[Session]) -> None:
    # an earlier run, not the one that ended the job
    assert (
        job_after_retry(sessions, job="failed", runs=[("failed", 1), ("failed", 1)], retried=0)
        == "failed"
    )
    # a run that never started did not fail the job (its script or creation did)
    assert job_after_retry(sessions, job="failed", runs=[("failed", 0)], retried=0) == "failed"
    # other final states are final
    assert (
        job_after_retry(sessions, job="cancelled", runs=[("failed", 1)], retried=0) == "cancelled"
    )
    assert (
        job_after_retry(sessions, job="completed", runs=[("failed", 1)], retried=0) == "completed"
    )
