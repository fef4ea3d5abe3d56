"""The gateway's tables: API keys (stored as hashes only), jobs, what jobs log (metrics,
a bounded set of samples), background tasks and the workers that run them.

Schema changes go through Alembic (`gateway/alembic`), never `create_all`.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from services.common.db import SampledText

# Where the gateway's migration history lives and its version table (the worker checks it too).
ALEMBIC_DIR = Path(__file__).resolve().parent / "alembic"
VERSION_TABLE = "alembic_version_gateway"


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite hands back naive ones)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    pass


class ApiKeyRow(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(64), primary_key=True,
                                    default=lambda: new_id("key"))
    name: Mapped[str] = mapped_column(String(128))
    prefix: Mapped[str] = mapped_column(String(16), doc="First characters, for display only")
    key_hash: Mapped[str] = mapped_column(String(64), unique=True, doc="sha256 hex of the key")
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    job_id: Mapped[str | None] = mapped_column(
        String(64), ForeignKey("jobs.id", ondelete="CASCADE", name="fk_api_keys_job_id",
                               use_alter=True),  # jobs also refers to api_keys
        index=True, default=None, doc="A job key: it acts for this one job of its owner only")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True,
                                    default=lambda: new_id("job"))
    name: Mapped[str] = mapped_column(String(128))
    base_model: Mapped[str] = mapped_column(String(1024))
    mode: Mapped[str] = mapped_column(String(16))
    lora: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16), index=True)
    owner_key_id: Mapped[str | None] = mapped_column(
        String(64), ForeignKey("api_keys.id"), index=True
    )
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)


class JobMetricRow(Base):
    """One value of one metric at one step; (job, name, step) is unique, so a re-sent point
    replaces the value instead of duplicating it."""

    __tablename__ = "job_metrics"
    __table_args__ = (UniqueConstraint("job_id", "name", "step", name="uq_job_metrics_point"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"),
                                    primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(64), ForeignKey("jobs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    step: Mapped[int] = mapped_column(BigInteger)
    value: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)


class JobSampleRow(Base):
    __tablename__ = "job_samples"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"),
                                    primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(64), ForeignKey("jobs.id", ondelete="CASCADE"),
                                        index=True)
    step: Mapped[int] = mapped_column(BigInteger)
    version: Mapped[int | None] = mapped_column(Integer, default=None)
    prompt: Mapped[str] = mapped_column(SampledText)
    completion: Mapped[str] = mapped_column(SampledText)
    reward: Mapped[float | None] = mapped_column(Float, default=None)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class BackgroundTaskRow(Base):
    """A background operation run by a Celery worker (gc, evaluate, export). Its status moves
    only through `gateway.task_states`; `attempts` doubles as the lease of the worker running
    it, which refreshes `heartbeat_at` while it works."""

    __tablename__ = "background_tasks"
    __table_args__ = (
        UniqueConstraint("job_id", "idempotency_key", name="uq_background_tasks_idempotency"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True,
                                    default=lambda: new_id("task"))
    job_id: Mapped[str | None] = mapped_column(
        String(64), ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
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
        JSON, default=None, doc="A managed run's last checkpoint (`RunProgress`): where it resumes")


class WorkerRow(Base):
    """A Celery worker process that was alive at `seen_at` (it refreshes the row on a timer);
    the stack's health reads it, since a worker has no port to ask."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(255), primary_key=True, doc="Celery's hostname")
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    seen_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
