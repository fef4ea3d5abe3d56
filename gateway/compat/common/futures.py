"""Calls that answer later, for the SDK protocols the gateway serves (Tinker's futures,
Weaver's operations): each submitted call gets an unguessable id at once, and a read of it
waits for the result (a long-poll), since both SDKs poll until it is there.

A call runs in the replica that took it; its row (`CompatCallRow`) says it exists, and holds
its result once done, so a poll reaching any gateway replica answers it. The replica running
it wakes its own pollers at once; another replica's pollers read the row every
`POLL_INTERVAL_S`."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gateway.compat.common.rows import CompatCallRow
from services.common.columns import utcnow
from services.common.db import in_transaction
from services.common.errors import LoomError, NotFound, error_from_envelope

Payload = bytes | dict[str, Any]
POLL_INTERVAL_S = 0.2
# A result is kept this long after its call was made; the SDKs read it within seconds.
KEEP = timedelta(days=1)
PRUNE_EVERY = 1000  # calls submitted between two prunings of old results


@dataclass(frozen=True)
class Outcome:
    """A finished call: its result, or the Loom error it failed with."""

    result: Payload | None = None
    error: LoomError | None = None


class Futures:
    def __init__(self, db: sessionmaker[Session], prefix: str) -> None:
        self.db = db
        self._prefix = prefix
        self._running: dict[str, asyncio.Task[Outcome]] = {}
        self._submitted = 0

    def new_id(self) -> str:
        return f"{self._prefix}-{uuid.uuid4().hex}"  # unguessable: ids are the only handle

    async def claim(self, model_id: str, seq_id: int) -> tuple[str, bool]:
        """The call numbered `seq_id` for `model_id`: an id and True when this replica takes
        the number (a new one, or one a refused call released), else the id of the call that
        took it and False."""
        call_id = self.new_id()
        numbered = (CompatCallRow.model_id == model_id, CompatCallRow.seq_id == seq_id)

        def take(session: Session) -> tuple[str, bool]:
            row = session.scalars(select(CompatCallRow).where(*numbered).with_for_update()).one()
            if not row.released:
                return row.id, False
            row.released, row.created_at = False, utcnow()
            return row.id, True

        try:
            await in_transaction(
                self.db,
                lambda s: s.add(CompatCallRow(id=call_id, model_id=model_id, seq_id=seq_id)),
            )
            return call_id, True
        except IntegrityError:
            return await in_transaction(self.db, take)

    async def release(self, call_id: str) -> None:
        """A claimed number whose call was refused before it ran: still used up, and a
        resent call is judged again, wherever it arrives."""
        await in_transaction(
            self.db,
            lambda s: s.execute(
                update(CompatCallRow).where(CompatCallRow.id == call_id).values(released=True)
            ),
        )

    async def mark_used(self, model_id: str, seq_id: int) -> None:
        """A number used up by a call refused before its turn (unless a call took it)."""
        with suppress(IntegrityError):
            await in_transaction(
                self.db,
                lambda s: s.add(
                    CompatCallRow(id=self.new_id(), model_id=model_id, seq_id=seq_id, released=True)
                ),
            )

    async def used(self, model_id: str, start: int, stop: int) -> set[int]:
        """The numbers of [start, stop) used up for `model_id`, on any replica."""
        query = select(CompatCallRow.seq_id).where(
            CompatCallRow.model_id == model_id,
            CompatCallRow.seq_id >= start,
            CompatCallRow.seq_id < stop,
        )
        found = await in_transaction(self.db, lambda s: s.scalars(query).all())
        return {n for n in found if n is not None}

    async def submit(self, work: Awaitable[Payload], call_id: str | None = None) -> str:
        """Run `work` as a call; `call_id`: one `claim` gave (its row exists already)."""
        if call_id is None:
            call_id = self.new_id()
            await in_transaction(self.db, lambda s: s.add(CompatCallRow(id=call_id)))
        self._running[call_id] = asyncio.ensure_future(self._run(call_id, work))
        self._submitted += 1
        if self._submitted % PRUNE_EVERY == 0:
            await in_transaction(
                self.db,
                lambda s: s.execute(
                    delete(CompatCallRow).where(CompatCallRow.created_at < utcnow() - KEEP)
                ),
            )
        return call_id

    async def _run(self, call_id: str, work: Awaitable[Payload]) -> Outcome:
        try:
            outcome = Outcome(result=await work)
        except LoomError as exc:
            outcome = Outcome(error=exc)
        except Exception as exc:  # noqa: BLE001 - a bug in a call is its caller's error
            outcome = Outcome(error=LoomError(f"internal error: {exc!r}"))

        def record(session: Session) -> None:
            row = session.get(CompatCallRow, call_id)
            if row is None:  # pruned while it ran
                return
            row.done = True
            if isinstance(outcome.result, bytes):
                row.result_bytes = outcome.result
            else:
                row.result_json = outcome.result
            if outcome.error is not None:
                row.error = {
                    "status": outcome.error.status_code,
                    "error": {
                        "code": outcome.error.code,
                        "message": outcome.error.message,
                        "detail": outcome.error.detail,
                    },
                }

        try:
            await in_transaction(self.db, record)
        finally:
            self._running.pop(call_id, None)
        return outcome

    async def wait(self, call_id: str, wait_s: float) -> Outcome | None:
        """The call's outcome, once done or after `wait_s` (None: still running), whichever
        comes first."""
        running = self._running.get(call_id)
        if running is not None:
            await asyncio.wait({running}, timeout=wait_s)
            return running.result() if running.done() else None
        deadline = time.monotonic() + wait_s
        while True:
            row = await in_transaction(self.db, lambda s: s.get(CompatCallRow, call_id))
            if row is None:
                raise NotFound(
                    f"No request {call_id!r} (unknown, or its result was dropped: "
                    f"the gateway keeps results for {KEEP.days} day)."
                )
            if row.done:
                return stored_outcome(row)
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(min(POLL_INTERVAL_S, max(deadline - time.monotonic(), 0)))


def stored_outcome(row: CompatCallRow) -> Outcome:
    if row.error is not None:
        return Outcome(error=error_from_envelope(row.error["status"], row.error))
    return Outcome(result=row.result_bytes if row.result_bytes is not None else row.result_json)
