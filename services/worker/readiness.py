"""Which of the stack's services are not ready now: what a task waits for after an outage, so
that a restart (a vLLM engine takes minutes to start) costs waiting, not the task's retries."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx2

from services.common.settings import SERVICES, LoomSettings

PROBE_TIMEOUT_S = 3.0
READY = ("ready", "ok")

# Of the services named, those not ready now, each with what it said (or why it did not
# answer).
Readiness = Callable[[tuple[str, ...]], Awaitable[dict[str, str]]]


def stack_readiness(settings: LoomSettings) -> Readiness:
    """Asks the services' `/readyz` (open without the service token) at once."""

    async def unready(names: tuple[str, ...]) -> dict[str, str]:
        unknown = set(names) - set(SERVICES)
        if unknown:
            raise ValueError(f"unknown services {sorted(unknown)}")
        async with httpx2.AsyncClient(timeout=PROBE_TIMEOUT_S) as client:
            answers = await asyncio.gather(
                *(_probe(client, settings.url_of(name)) for name in names)
            )
        return {name: why for name, why in zip(names, answers, strict=True) if why}

    return unready


async def _probe(client: httpx2.AsyncClient, url: str) -> str:
    """'' when ready; else what the service said, or why it did not answer."""
    try:
        response = await client.get(f"{url}/readyz")
    except httpx2.TransportError as exc:
        return f"unreachable at {url} ({type(exc).__name__})"
    try:
        status = str(response.json().get("status", ""))
    except (ValueError, AttributeError):
        status = f"HTTP {response.status_code}"
    return "" if status in READY and response.status_code < 400 else status or "not ready"
