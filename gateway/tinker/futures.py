"""Tinker's futures on the gateway: each submitted call gets a request id at once; its result
(protobuf bytes or JSON) is kept until read, and a read waits for it (long-poll), since the SDK
asks again at once whenever it is told to try again."""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict
from collections.abc import Awaitable
from typing import Any

from services.common.errors import LoomError, NotFound

Payload = bytes | dict[str, Any]
PENDING = object()  # retrieve's answer while the call still runs


def failure(exc: BaseException) -> dict[str, Any]:
    """The SDK's failed-future body: its category decides whether a script may retry."""
    if isinstance(exc, LoomError):
        category = "user" if 400 <= exc.status_code < 500 else "server"
        return {"error": exc.message, "category": category}
    return {"error": f"internal error: {exc!r}", "category": "server"}


class Futures:
    def __init__(self, keep: int = 10_000) -> None:
        self._calls: OrderedDict[str, asyncio.Task[Payload]] = OrderedDict()
        self._keep = keep

    def submit(self, work: Awaitable[Payload]) -> str:
        request_id = f"req-{uuid.uuid4().hex}"  # unguessable: ids are the only handle
        self._calls[request_id] = asyncio.ensure_future(work)
        while len(self._calls) > self._keep:  # the oldest results go first
            _, oldest = self._calls.popitem(last=False)
            oldest.cancel()
        return request_id

    async def retrieve(self, request_id: str, wait_s: float) -> Payload | object:
        call = self._calls.get(request_id)
        if call is None:
            raise NotFound(f"No request {request_id!r} (unknown, or its result was dropped: "
                           f"the gateway keeps the last {self._keep}).")
        done, _ = await asyncio.wait({call}, timeout=wait_s)
        if not done:
            return PENDING
        if call.cancelled():
            return failure(LoomError("the request was cancelled"))
        if (exc := call.exception()) is not None:
            return failure(exc)
        return call.result()
