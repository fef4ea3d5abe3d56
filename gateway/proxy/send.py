"""Sending a rollout call to a replica: picked by `gateway.proxy.routing`, retried on the next
one when it cannot be reached (nothing started there), and counted while it runs so that
least-outstanding-work sees this gateway's own load at once. The proxy (`/v1/rollout/*`) and
the gateway's own rollout client (`gateway.proxy.replica_transport`: Tinker, Weaver) both send
here."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import httpx2

from gateway.proxy import routing
from gateway.proxy.replicas import Replica, ReplicaRegistry
from gateway.proxy.target import ProxyTarget
from services.common.errors import Unavailable
from services.common.http import transport_error

log = logging.getLogger(__name__)
Content = bytes | AsyncIterator[bytes] | None
Headers = list[tuple[bytes, bytes]]


@dataclass
class Sent:
    """An upstream response and what releases it (once, however often called)."""

    response: httpx2.Response
    release: Callable[[], Awaitable[None]]


async def send(
    client: httpx2.AsyncClient, service: str, request: httpx2.Request
) -> httpx2.Response:
    """Send, streaming the answer. A connection that could not be made is `Unavailable` (the
    service never saw the request); a failure after that is an `UpstreamError`."""
    try:
        return await client.send(request, stream=True)
    except httpx2.TransportError as exc:
        raise transport_error(service, client.base_url, exc) from exc


async def send_routed(
    registry: ReplicaRegistry,
    method: str,
    target: ProxyTarget,
    headers: Headers,
    content: Content,
    affinity: str | None,
) -> Sent:
    """`method target` on the best replica for it, or the next ones while they cannot be
    reached; `affinity` is the caller's `X-Loom-Affinity`."""
    candidates = registry.candidates()
    if not candidates:
        raise Unavailable(
            "No rollout replica is registered, and no LOOM_ROLLOUT_URL is configured.",
            {"service": "rollout"},
        )
    if (
        len(candidates) > 1
        and isinstance(content, AsyncIterator)
        and routing.reads_body(method, target.segments)
    ):
        # Read (capped already) so routing can see the version, and a retry can resend it.
        content = b"".join([chunk async for chunk in content])
    body = content if isinstance(content, bytes) else None
    key = routing.route_key(target.segments, body, affinity)
    ordered = routing.order(candidates, key, registry.newest, registry.next_turn())
    if isinstance(content, AsyncIterator):  # a body streamed through can be sent only once
        ordered = ordered[:1]
    for attempt, replica in enumerate(ordered, start=1):
        try:
            return await _send_to(replica, method, target, headers, content)
        except Unavailable:
            registry.set_aside(replica)
            if attempt == len(ordered):
                raise
            log.warning(
                "rollout replica %s (%s) unreachable; retrying on another", replica.id, replica.url
            )
    raise AssertionError("unreachable: `ordered` is never empty")


async def _send_to(
    replica: Replica, method: str, target: ProxyTarget, headers: Headers, content: Content
) -> Sent:
    replica.in_flight += 1
    replica.routed += 1
    released = False

    async def release() -> None:
        nonlocal released
        if not released:
            released = True
            replica.in_flight -= 1
            await response.aclose()

    try:
        response = await send(
            replica.client,
            "rollout",
            replica.client.build_request(method, target.target, headers=headers, content=content),
        )
    except BaseException:
        replica.in_flight -= 1
        raise
    return Sent(response, release)
