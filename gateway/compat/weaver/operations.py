"""Weaver's operations on the gateway's `Futures`: every training and sampling call answers
at once with an operation, which the SDK polls (`GET /operations/{id}`) until its status is
`done` or `error`. A poll waits a while for the result, so a fast call is seen on the first
poll rather than after the SDK's next back-off."""

from __future__ import annotations

import asyncio

from gateway.compat.common.futures import Futures, Payload
from gateway.compat.weaver.errors import retryable
from gateway.compat.weaver.schemas import Operation
from services.common.errors import LoomError

# Well under the SDK's 60 s read timeout.
POLL_WAIT_S = 20.0


def envelope(op_id: str, call: asyncio.Task[Payload]) -> Operation:
    """The operation as the SDK reads it: the error fields only set when it failed."""
    if not call.done():
        return Operation(id=op_id, status="pending", response=None)
    if call.cancelled():
        return failed(op_id, LoomError("The operation was cancelled (the gateway keeps the "
                                       "newest operations only)."))
    if (exc := call.exception()) is not None:
        return failed(op_id, exc)
    return Operation(id=op_id, status="done", response=call.result())


def failed(op_id: str, exc: BaseException) -> Operation:
    if not isinstance(exc, LoomError):
        exc = LoomError(f"internal error: {exc!r}")
    return Operation(id=op_id, status="error", response=None, error_code=exc.code,
                     error_message=exc.message, retryable=retryable(exc))


async def submitted(futures: Futures, op_id: str) -> Operation:
    """The answer to a submission: the operation, already done if it took no time."""
    return envelope(op_id, await futures.wait(op_id, 0))


async def poll(futures: Futures, op_id: str, wait_s: float = POLL_WAIT_S) -> Operation:
    return envelope(op_id, await futures.wait(op_id, wait_s))
