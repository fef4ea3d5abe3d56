"""The gateway's tables: API keys (stored as hashes only) and jobs.

Schema changes go through Alembic (`gateway/alembic`), never `create_all`.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, ForeignKey, String, TypeDecorator
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


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
