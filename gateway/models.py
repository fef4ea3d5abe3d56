"""The gateway's tables: API keys (stored as hashes only), jobs and what jobs log (metrics,
a bounded set of samples). Background tasks and the workers that run them are the worker's
(`services.worker.models`, with a history of its own).

Schema changes go through Alembic (`gateway/alembic`), never `create_all`.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Integer,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from services.common.columns import UtcDateTime, new_id, utcnow
from services.common.db import SampledText

# Where the gateway's migration history lives and its version table.
ALEMBIC_DIR = Path(__file__).resolve().parent / "alembic"
VERSION_TABLE = "alembic_version_gateway"


class Base(DeclarativeBase):
    pass


class ApiKeyRow(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=lambda: new_id("key"))
    name: Mapped[str] = mapped_column(String(128))
    prefix: Mapped[str] = mapped_column(String(16), doc="First characters, for display only")
    key_hash: Mapped[str] = mapped_column(String(64), unique=True, doc="sha256 hex of the key")
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    job_id: Mapped[str | None] = mapped_column(
        String(64),
        ForeignKey(
            "jobs.id", ondelete="CASCADE", name="fk_api_keys_job_id", use_alter=True
        ),  # jobs also refers to api_keys
        index=True,
        default=None,
        doc="A job key: it acts for this one job of its owner only",
    )
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=lambda: new_id("job"))
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

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    job_id: Mapped[str] = mapped_column(String(64), ForeignKey("jobs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    step: Mapped[int] = mapped_column(BigInteger)
    value: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)


class JobSampleRow(Base):
    __tablename__ = "job_samples"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    job_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("jobs.id", ondelete="CASCADE"), index=True
    )
    step: Mapped[int] = mapped_column(BigInteger)
    version: Mapped[int | None] = mapped_column(Integer, default=None)
    prompt: Mapped[str] = mapped_column(SampledText)
    completion: Mapped[str] = mapped_column(SampledText)
    reward: Mapped[float | None] = mapped_column(Float, default=None)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
