"""What the SDK protocols keep between calls, in the gateway's database rather than one
process's memory, so every gateway replica serves every SDK client: sessions, sampling
sessions, named sampler weights and the calls that answer later (their results, and the
seq_id each training call was numbered with, so a resent call is one call on any replica).

The tables are in the gateway's migration history (`gateway/alembic`, revision 0005)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Integer, LargeBinary, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from gateway.models import Base
from services.common.columns import UtcDateTime, utcnow


class CompatSessionRow(Base):
    """A Tinker or Weaver session: the key that made it owns what is made under it."""

    __tablename__ = "compat_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    protocol: Mapped[str] = mapped_column(String(16))
    owner_key_id: Mapped[str] = mapped_column(String(64), index=True)
    name: Mapped[str | None] = mapped_column(String(256), default=None)
    # Weaver's models made in it, by model_seq_id: a resent create_model is the same model
    models: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)


class CompatSamplerRow(Base):
    """A sampling session: a (job, version) pair of rollout's (no job: the base model)."""

    __tablename__ = "compat_samplers"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    protocol: Mapped[str] = mapped_column(String(16))
    owner_key_id: Mapped[str] = mapped_column(String(64))
    base_model: Mapped[str] = mapped_column(String(1024))  # as the SDK named it
    job_id: Mapped[str | None] = mapped_column(String(64), default=None)
    version: Mapped[int] = mapped_column(Integer)
    model_path: Mapped[str | None] = mapped_column(String(2048), default=None)
    tokenizer_path: Mapped[str | None] = mapped_column(String(2048), default=None)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class CompatSamplerWeightsRow(Base):
    """Sampler weights saved under a name (`tinker://...`, `weaver://...`): the version it
    names, forgotten from `expires_at` on."""

    __tablename__ = "compat_sampler_weights"

    path: Mapped[str] = mapped_column(String(2048), primary_key=True)
    owner_key_id: Mapped[str | None] = mapped_column(String(64), default=None)
    base_model: Mapped[str] = mapped_column(String(1024))
    job_id: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)
    saved_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=None)


class CompatCallRow(Base):
    """A call that answers later (Tinker's future, Weaver's operation): pending until the
    replica running it writes its result or its error. A numbered training call also holds
    its model and seq_id: the first replica to claim a number owns the call. A number used
    up by a refused call is `released`: it counts as used, and a resent call may claim it.
    The replica running a call renews `alive_at` while it runs (gateway revision 0006), so a
    call whose replica died is failed by the next poll instead of pending for ever."""

    __tablename__ = "compat_calls"
    __table_args__ = (UniqueConstraint("model_id", "seq_id", name="uq_compat_calls_seq"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    model_id: Mapped[str | None] = mapped_column(String(255), default=None)
    seq_id: Mapped[int | None] = mapped_column(Integer, default=None)
    done: Mapped[bool] = mapped_column(default=False)
    released: Mapped[bool] = mapped_column(default=False)
    result_json: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    result_bytes: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)
    # a LoomError's envelope and status, rebuilt by `error_from_envelope`
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)
    alive_at: Mapped[datetime | None] = mapped_column(UtcDateTime, default=utcnow)
