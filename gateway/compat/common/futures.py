"""Calls that answer later, for the SDK protocols the gateway serves (Tinker's futures,
Weaver's operations): each submitted call gets an unguessable id at once, and a read of it
waits for the result (a long-poll), since both SDKs poll until it is there."""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict
from collections.abc import Awaitable
from typing import Any

from services.common.errors import NotFound

Payload = bytes | dict[str, Any]


class Futures:
    def __init__(self, prefix: str, keep: int = 10_000) -> None:
        self._calls: OrderedDict[str, asyncio.Task[Payload]] = OrderedDict()
        self._prefix = prefix
        self._keep = keep

    def submit(self, work: Awaitable[Payload]) -> str:
        call_id = f"{self._prefix}-{uuid.uuid4().hex}"  # unguessable: ids are the only handle
        self._calls[call_id] = asyncio.ensure_future(work)
        while len(self._calls) > self._keep:  # the oldest results go first
            _, oldest = self._calls.popitem(last=False)
            oldest.cancel()
        return call_id

    async def wait(self, call_id: str, wait_s: float) -> asyncio.Task[Payload]:
        """The call, once done or after `wait_s`, whichever comes first."""
        call = self._calls.get(call_id)
        if call is None:
            raise NotFound(f"No request {call_id!r} (unknown, or its result was dropped: "
                           f"the gateway keeps the last {self._keep}).")
        await asyncio.wait({call}, timeout=wait_s)
        return call
