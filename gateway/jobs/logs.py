"""What a job logs for inspection: metrics (step, name, value) and a bounded set of samples.

Data functions take a session and only flush; the caller owns the transaction. Metric points
are upserted on (job, name, step), so a script or task that retries a request after a timeout
replaces its own values instead of adding duplicates. Samples keep the newest `keep` per job.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from gateway.jobs.metric_names import phase_of
from gateway.models import JobMetricRow, JobSampleRow, utcnow
from gateway.schemas import JobProgress, LoggedSample, MetricPoint, MetricSeries, SampleRecord
from gateway.trackers import mirror as trackers

# Rows per INSERT statement: well under SQLite's 32,766 bound parameters (5 per row).
INSERT_BATCH = 1_000


def log_metrics(session: Session, job_id: str, points: list[MetricPoint]) -> int:
    """Record `points`; the last value given for a (name, step) wins, also within one call."""
    latest = {(p.name, p.step): p.value for p in points}
    now = utcnow()
    rows = [
        {"job_id": job_id, "name": name, "step": step, "value": value, "updated_at": now}
        for (name, step), value in latest.items()
    ]
    insert = _upsert_dialect(session)
    for start in range(0, len(rows), INSERT_BATCH):
        statement = insert(JobMetricRow).values(rows[start : start + INSERT_BATCH])
        session.execute(
            statement.on_conflict_do_update(
                index_elements=["job_id", "name", "step"],
                set_={
                    "value": statement.excluded.value,
                    "updated_at": statement.excluded.updated_at,
                },
            )
        )
    session.flush()
    trackers.stage(
        session,
        job_id,
        [MetricPoint(name=name, step=step, value=value) for (name, step), value in latest.items()],
    )
    return len(rows)


def metric_series(
    session: Session, job_id: str, names: list[str] | None = None, since_step: int | None = None
) -> list[MetricSeries]:
    """Every metric of the job (or the `names` asked for), steps ascending, after `since_step`
    when given: a live chart asks only for what it has not drawn yet."""
    query = (
        select(JobMetricRow.name, JobMetricRow.step, JobMetricRow.value)
        .where(JobMetricRow.job_id == job_id)
        .order_by(JobMetricRow.name, JobMetricRow.step)
    )
    if names:
        query = query.where(JobMetricRow.name.in_(names))
    if since_step is not None:
        query = query.where(JobMetricRow.step > since_step)
    series: dict[str, MetricSeries] = {}
    for name, step, value in session.execute(query):
        line = series.setdefault(name, MetricSeries(name=name, steps=[], values=[]))
        line.steps.append(step)
        line.values.append(value)
    return list(series.values())


def progress(session: Session, job_ids: Iterable[str]) -> dict[str, JobProgress]:
    """Per job: the phase it logged a metric for last (see `phase_of`), that phase's newest
    step, and when the job last logged one. Phases count their own steps, so the newest step
    over all names would report an SFT step long after RL began."""
    ids = list(job_ids)
    if not ids:
        return {}
    query = (
        select(
            JobMetricRow.job_id,
            JobMetricRow.name,
            func.max(JobMetricRow.step),
            func.max(JobMetricRow.updated_at),
        )
        .where(JobMetricRow.job_id.in_(ids))
        .group_by(JobMetricRow.job_id, JobMetricRow.name)
    )
    phases: dict[str, dict[str, tuple[int, datetime]]] = {}
    for job_id, name, step, updated in session.execute(query):
        per_job = phases.setdefault(job_id, {})
        newest = per_job.get(phase := phase_of(name))
        per_job[phase] = (
            (max(step, newest[0]), max(updated, newest[1])) if newest else (step, updated)
        )
    result = {}
    for job_id, per_job in phases.items():
        # Logged at the same time, a named phase says more than unphased names beside it.
        phase, (step, _) = max(
            per_job.items(), key=lambda item: (item[1][1], bool(item[0]), item[1][0])
        )
        result[job_id] = JobProgress(
            step=step, phase=phase or None, updated_at=max(u for _, u in per_job.values())
        )
    return result


def log_samples(session: Session, job_id: str, samples: list[SampleRecord], keep: int) -> int:
    """Append `samples`, then drop the job's oldest beyond the newest `keep`; trackers that
    take samples get them all (they keep their own history)."""
    now = utcnow()
    session.add_all(JobSampleRow(job_id=job_id, created_at=now, **s.model_dump()) for s in samples)
    session.flush()
    trackers.stage(session, job_id, [], samples)
    cutoff = session.scalar(
        select(JobSampleRow.id)
        .where(JobSampleRow.job_id == job_id)
        .order_by(JobSampleRow.id.desc())
        .offset(keep)
        .limit(1)
    )
    if cutoff is not None:
        session.execute(
            delete(JobSampleRow).where(JobSampleRow.job_id == job_id, JobSampleRow.id <= cutoff)
        )
    return len(samples)


def recent_samples(session: Session, job_id: str, limit: int) -> list[LoggedSample]:
    """The newest `limit` samples of the job, newest first."""
    rows = session.scalars(
        select(JobSampleRow)
        .where(JobSampleRow.job_id == job_id)
        .order_by(JobSampleRow.id.desc())
        .limit(limit)
    )
    return [
        LoggedSample(
            id=r.id,
            step=r.step,
            version=r.version,
            prompt=r.prompt,
            completion=r.completion,
            reward=r.reward,
            created_at=r.created_at,
        )
        for r in rows
    ]


def _upsert_dialect(session: Session) -> Any:
    name = session.get_bind().dialect.name
    if name == "postgresql":
        return postgresql.insert
    if name == "sqlite":
        return sqlite.insert
    raise NotImplementedError(f"Metric upserts support PostgreSQL and SQLite, not {name}.")
