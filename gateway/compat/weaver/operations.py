"""Weaver's operations on the gateway's `Futures`: every training and sampling call answers
at once with an operation, which the SDK polls (`GET /operations/{id}`) until its status is
`done` or `error`. A poll waits a while for the result, so a fast call is seen on the first
poll rather than after the SDK's next back-off."""

from __future__ import annotations

from gateway.compat.common.futures import Futures, Outcome
from gateway.compat.weaver.errors import retryable
from gateway.compat.weaver.schemas import Operation
from services.common.errors import LoomError

# Well under the SDK's 60 s read timeout.
POLL_WAIT_S = 20.0


def envelope(op_id: str, outcome: Outcome | None) -> Operation:
    """The operation as the SDK reads it: the error fields only set when it failed."""
    if outcome is None:
        return Operation(id=op_id, status="pending", response=None)
    if outcome.error is not None:
        return failed(op_id, outcome.error)
    return Operation(id=op_id, status="done", response=outcome.result)


def failed(op_id: str, exc: LoomError) -> Operation:
    return Operation(
        id=op_id,
        status="error",
        response=None,
        error_code=exc.code,
        error_message=exc.message,
        retryable=retryable(exc),
    )


async def submitted(futures: Futures, op_id: str) -> Operation:
    """The answer to a submission: the operation, already done if it took no time."""
    return envelope(op_id, await futures.wait(op_id, 0))


async def poll(futures: Futures, op_id: str, wait_s: float = POLL_WAIT_S) -> Operation:
    return envelope(op_id, await futures.wait(op_id, wait_s))
