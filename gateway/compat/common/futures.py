"""Calls that answer later, for the SDK protocols the gateway serves (Tinker's futures,
Weaver's operations): each submitted call gets an unguessable id at once, and a read of it
waits for the result (a long-poll), since both SDKs poll until it is there.

A call runs in the replica that took it; its row (`CompatCallRow`) says it exists, and holds
its result once done, so a poll reaching any gateway replica answers it. The replica running
it wakes its own pollers at once; another replica's pollers read the row every
`POLL_INTERVAL_S`.

A replica can die (or restart) with calls running. While it runs calls it renews their rows'
`alive_at` every `HEARTBEAT_S`; a poll that finds a pending call not renewed for `STALE_AFTER`
fails it for good (one conditional update, so every replica answers the same), and the SDK's
poll ends with an error it can act on instead of waiting for ever. Each replica judges by its
own clock: replicas' clocks must agree to well within `STALE_AFTER - HEARTBEAT_S`."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gateway.compat.common.rows import CompatCallRow
from services.common.columns import utcnow
from services.common.db import in_transaction
from services.common.errors import LoomError, NotFound, Unavailable, error_from_envelope

log = logging.getLogger(__name__)
Payload = bytes | dict[str, Any]
POLL_INTERVAL_S = 0.2
# A result is kept this long after its call was made; the SDKs read it within seconds.
KEEP = timedelta(days=1)
PRUNE_EVERY = 1000  # calls submitted between two prunings of old results
HEARTBEAT_S = 5.0  # how often a replica renews the calls it runs
STALE_AFTER = timedelta(seconds=30)  # a pending call not renewed for this long was abandoned


@dataclass(frozen=True)
class Outcome:
    """A finished call: its result, or the Loom error it failed with."""

    result: Payload | None = None
    error: LoomError | None = None


class Futures:
    def __init__(
        self,
        db: sessionmaker[Session],
        prefix: str,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        stale_after: timedelta = STALE_AFTER,
    ) -> None:
        self.db = db
        self._prefix = prefix
        self._running: dict[str, asyncio.Task[Outcome]] = {}
        self._submitted = 0
        self._heartbeat_s = heartbeat_s
        self._stale_after = stale_after
        self._heartbeat: asyncio.Task[None] | None = None

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
            row.released, row.created_at, row.alive_at = False, utcnow(), utcnow()
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
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.ensure_future(self._renew_running())
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
            if row is None or row.done:  # pruned, or given up for abandoned, while it ran
                return
            row.done = True
            if isinstance(outcome.result, bytes):
                row.result_bytes = outcome.result
            else:
                row.result_json = outcome.result
            if outcome.error is not None:
                row.error = _envelope(outcome.error)

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
            if (row.alive_at or row.created_at) < utcnow() - self._stale_after:
                abandoned = await self._abandon(call_id)
                if abandoned is not None:
                    return abandoned
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(min(POLL_INTERVAL_S, max(deadline - time.monotonic(), 0)))

    async def _renew_running(self) -> None:
        """Says, every `heartbeat_s` while this replica runs calls, that it still runs them."""
        while self._running:
            await asyncio.sleep(self._heartbeat_s)
            running = list(self._running)
            if not running:
                return
            renew = (
                update(CompatCallRow)
                .where(CompatCallRow.id.in_(running), CompatCallRow.done.is_(False))
                .values(alive_at=utcnow())
            )
            try:
                await in_transaction(self.db, lambda s, statement=renew: s.execute(statement))
            except Exception:  # noqa: BLE001 - a database hiccup: the next beat tries again
                log.warning("could not renew %d running calls", len(running), exc_info=True)

    async def _abandon(self, call_id: str) -> Outcome | None:
        """Fails a pending call whose replica stopped renewing it (unless it has just ended or
        been renewed: the update is conditional), and answers what the row then says."""
        error = Unavailable(
            f"The gateway replica running request {call_id!r} stopped before it finished (no "
            f"sign of it for {self._stale_after.total_seconds():.0f} s): whether it took effect "
            "is unknown. Check the model's state (e.g. its step) and send the call again.",
            detail={"call_id": call_id, "reason": "gateway_replica_lost"},
        )
        cutoff = utcnow() - self._stale_after
        give_up = (
            update(CompatCallRow)
            .where(
                CompatCallRow.id == call_id,
                CompatCallRow.done.is_(False),
                or_(
                    CompatCallRow.alive_at < cutoff,
                    CompatCallRow.alive_at.is_(None) & (CompatCallRow.created_at < cutoff),
                ),
            )
            .values(done=True, error=_envelope(error))
        )

        def settle(session: Session) -> CompatCallRow | None:
            session.execute(give_up)
            return session.get(CompatCallRow, call_id, populate_existing=True)

        row = await in_transaction(self.db, settle)
        if row is None:
            raise NotFound(f"No request {call_id!r}.")
        return stored_outcome(row) if row.done else None  # not done: renewed meanwhile


def _envelope(error: LoomError) -> dict[str, Any]:
    return {
        "status": error.status_code,
        "error": {"code": error.code, "message": error.message, "detail": error.detail},
    }


def stored_outcome(row: CompatCallRow) -> Outcome:
    if row.error is not None:
        return Outcome(error=error_from_envelope(row.error["status"], row.error))
    return Outcome(result=row.result_bytes if row.result_bytes is not None else row.result_json)
