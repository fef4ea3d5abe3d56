"""Tinker's futures on the gateway's `Futures`: what `retrieve_future` answers."""

from __future__ import annotations

from typing import Any

from gateway.compat.common.futures import Futures, Payload
from services.common.errors import LoomError

PENDING = object()  # retrieve's answer while the call still runs


def failure(exc: BaseException) -> dict[str, Any]:
    """The SDK's failed-future body: its category decides whether a script may retry."""
    if isinstance(exc, LoomError):
        category = "user" if 400 <= exc.status_code < 500 else "server"
        return {"error": exc.message, "category": category}
    return {"error": f"internal error: {exc!r}", "category": "server"}


async def retrieve(futures: Futures, request_id: str, wait_s: float) -> Payload | object:
    outcome = await futures.wait(request_id, wait_s)
    if outcome is None:
        return PENDING
    if outcome.error is not None:
        return failure(outcome.error)
    return outcome.result
