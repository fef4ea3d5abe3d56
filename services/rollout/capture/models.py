"""Database rows of captured trajectories. Migrations: `services/rollout/alembic`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, ForeignKey, Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from services.common.db import SampledText


class Base(DeclarativeBase):
    pass


class TrajectoryRow(Base):
    """A trajectory an agent's OpenAI calls are recorded into; it decides which job and
    version answer them."""

    __tablename__ = "trajectories"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    job_id: Mapped[str | None] = mapped_column(String(128))
    version: Mapped[str] = mapped_column(String(64))
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class CallRow(Base):
    """One completion of one OpenAI call (a call with n=4 records four), in order. `parent`
    is the earlier call whose prompt and completion this call's prompt extends."""

    __tablename__ = "trajectory_calls"

    trajectory_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("trajectories.id", ondelete="CASCADE"), primary_key=True
    )
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    parent: Mapped[int | None] = mapped_column(Integer)
    endpoint: Mapped[str] = mapped_column(String(16))
    version: Mapped[int] = mapped_column(Integer)
    prompt_token_ids: Mapped[list[int]] = mapped_column(JSON)
    token_ids: Mapped[list[int]] = mapped_column(JSON)
    logprobs: Mapped[list[float]] = mapped_column(JSON)
    finish_reason: Mapped[str] = mapped_column(String(16))
    text: Mapped[str] = mapped_column(SampledText)
    # Chat calls: the request's conversation, tools and the reply, as the template takes them.
    messages: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    tools: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    reply: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
