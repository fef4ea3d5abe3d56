"""The worker's tables: background tasks and the workers that run them, in the gateway's
database (a task belongs to a job: deleting the job deletes its tasks), with a migration
history of their own (`services/worker/alembic`, version table `alembic_version_worker`).

Whoever needs the tables first migrates them: the gateway (it inserts tasks when it
dispatches) and the worker, each at start; the history's advisory lock makes that safe.
Schema changes go through Alembic, never `create_all`."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, Integer, String, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from services.common.columns import UtcDateTime, new_id, utcnow

ALEMBIC_DIR = Path(__file__).resolve().parent / "alembic"
VERSION_TABLE = "alembic_version_worker"
# The gateway's table a task's `job_id` refers to (ON DELETE CASCADE). The foreign key is made
# by the migrations only: this metadata does not hold the gateway's tables, and an ORM
# foreign key to a table it does not know fails every flush.
JOBS_TABLE = "jobs"


class GatewayNotMigrated(RuntimeError):
    """The gateway's `jobs` table, which tasks refer to, does not exist yet (raised by the
    first revision; the worker tries again)."""


class Base(DeclarativeBase):
    pass


class BackgroundTaskRow(Base):
    """A background operation run by a Celery worker (gc, evaluate, export, a managed run).
    Its status moves only through `services.worker.task_states`; `attempts` doubles as the
    lease of the worker running it, which refreshes `heartbeat_at` while it works."""

    __tablename__ = "background_tasks"
    __table_args__ = (
        UniqueConstraint("job_id", "idempotency_key", name="uq_background_tasks_idempotency"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=lambda: new_id("task"))
    job_id: Mapped[str | None] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16), index=True)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    idempotency_key: Mapped[str | None] = mapped_column(String(128), default=None)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)
    progress: Mapped[dict[str, Any] | None] = mapped_column(
        JSON, default=None, doc="A managed run's last checkpoint (`RunProgress`): where it resumes"
    )


class WorkerRow(Base):
    """A Celery worker process that was alive at `seen_at` (it refreshes the row on a timer);
    the stack's health reads it, since a worker has no port to ask."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(255), primary_key=True, doc="Celery's hostname")
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    seen_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
