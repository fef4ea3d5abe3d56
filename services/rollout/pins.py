"""Pins in modelstate for the versions this engine has resident, so retention and deletion
never remove what it serves. The resident set is read locally every `poll_s`; modelstate is
told when it changes and, as a lease renewal, every `ttl_s / 3`. An engine that dies stops
renewing and its pins lapse."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

from modelstate.schemas import PinList, VersionKey
from services.common.errors import LoomError

log = logging.getLogger(__name__)


class PinStore(Protocol):
    async def set_pins(self, holder: str, versions: list[VersionKey], ttl_s: float) -> PinList: ...


def holder_name(rollout_url: str) -> str:
    return f"rollout@{urlsplit(rollout_url).netloc}"


class PinKeeper:
    def __init__(
        self,
        store: PinStore,
        holder: str,
        resident: Callable[[], list[VersionKey]],
        *,
        ttl_s: float = 60.0,
        poll_s: float = 0.5,
    ) -> None:
        self.store = store
        self.holder = holder
        self.resident = resident
        self.ttl_s = ttl_s
        self.poll_s = poll_s

    async def run(self) -> None:
        """Until cancelled; then the pins are released."""
        sent: list[VersionKey] | None = None
        renewed_at = 0.0
        try:
            while True:
                keys = sorted(self.resident(), key=lambda k: (k.job_id, k.number))
                due = time.monotonic() - renewed_at > self.ttl_s / 3
                if keys != sent or due:
                    try:
                        await self.store.set_pins(self.holder, keys, self.ttl_s)
                        sent, renewed_at = keys, time.monotonic()
                    except LoomError as exc:  # modelstate down: pins lapse, retried next poll
                        log.warning("could not pin resident versions: %s", exc.message)
                await asyncio.sleep(self.poll_s)
        finally:
            if sent:  # released now rather than at the lease's end; they lapse anyway
                with contextlib.suppress(LoomError, asyncio.CancelledError):
                    await asyncio.shield(self.store.set_pins(self.holder, [], 1.0))
