"""Captured trajectories in the database: a trajectory's row and its calls, in order.

A call is written before its response is sent, so whatever an agent was answered is kept."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from services.common.db import transaction
from services.common.errors import NotFound
from services.rollout.capture.models import CallRow, TrajectoryRow
from services.rollout.schemas import CapturedCall, TrajectoryCreate, TrajectoryInfo, VersionRef


@dataclass
class NewCall:
    endpoint: str
    version: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str
    parent: int | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    reply: dict[str, Any] | None = None


@dataclass
class StoredCall(NewCall):
    index: int = 0
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def sequence(self) -> list[int]:
        return [*self.prompt_token_ids, *self.token_ids]

    def public(self) -> CapturedCall:
        return CapturedCall(
            index=self.index,
            parent=self.parent,
            endpoint=self.endpoint,
            version=self.version,
            prompt_token_ids=self.prompt_token_ids,
            token_ids=self.token_ids,
            logprobs=self.logprobs,
            finish_reason=self.finish_reason,
            text=self.text,
        )


class TrajectoryStore:
    """Synchronous (SQLAlchemy sessions): call it from a thread, not the event loop."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions
        self._append = threading.Lock()

    def create(self, request: TrajectoryCreate) -> TrajectoryInfo:
        row = TrajectoryRow(
            id=f"traj_{uuid.uuid4().hex}",
            job_id=request.job_id,
            version=str(request.version),
            meta=request.metadata,
            created_at=datetime.now(UTC),
        )
        with transaction(self.sessions) as session:
            session.add(row)
        return _info(row, 0)

    def info(self, trajectory_id: str) -> TrajectoryInfo:
        with self.sessions() as session:
            row = _get(session, trajectory_id)
            count = (
                session.scalar(select(func.count()).where(CallRow.trajectory_id == trajectory_id))
                or 0
            )
            return _info(row, count)

    def calls(self, trajectory_id: str) -> list[StoredCall]:
        with self.sessions() as session:
            _get(session, trajectory_id)
            rows = session.scalars(
                select(CallRow)
                .where(CallRow.trajectory_id == trajectory_id)
                .order_by(CallRow.index)
            ).all()
            return [_stored(row) for row in rows]

    def add(self, trajectory_id: str, calls: list[NewCall]) -> list[int]:
        """Append `calls` (together, in order); their indexes. Appends to one trajectory take
        turns: a row lock across processes (PostgreSQL), this lock within one (SQLite)."""
        with self._append, transaction(self.sessions) as session:
            _get(session, trajectory_id, lock=True)
            last = session.scalar(
                select(func.max(CallRow.index)).where(CallRow.trajectory_id == trajectory_id)
            )
            first = 0 if last is None else last + 1
            now = datetime.now(UTC)
            session.add_all(
                CallRow(trajectory_id=trajectory_id, index=first + i, created_at=now, **vars(call))
                for i, call in enumerate(calls)
            )
        return list(range(first, first + len(calls)))

    def delete(self, trajectory_id: str) -> None:
        with transaction(self.sessions) as session:
            session.delete(_get(session, trajectory_id))


def _get(session: Session, trajectory_id: str, lock: bool = False) -> TrajectoryRow:
    row = session.get(TrajectoryRow, trajectory_id, with_for_update=lock)
    if row is None:
        raise NotFound(
            f"Trajectory {trajectory_id!r} does not exist (or was deleted): "
            "create one with POST /v1/trajectories and use the id it returns.",
            {"trajectory_id": trajectory_id},
        )
    return row


def _info(row: TrajectoryRow, calls: int) -> TrajectoryInfo:
    version: VersionRef = int(row.version) if row.version.isdigit() else row.version
    return TrajectoryInfo(
        id=row.id,
        job_id=row.job_id,
        version=version,
        metadata=row.meta,
        created_at=row.created_at,
        calls=calls,
    )


def _stored(row: CallRow) -> StoredCall:
    return StoredCall(
        index=row.index,
        parent=row.parent,
        endpoint=row.endpoint,
        version=row.version,
        prompt_token_ids=list(row.prompt_token_ids),
        token_ids=list(row.token_ids),
        logprobs=list(row.logprobs),
        finish_reason=row.finish_reason,
        text=row.text,
        messages=row.messages,
        tools=row.tools,
        reply=row.reply,
        created_at=row.created_at,
    )
