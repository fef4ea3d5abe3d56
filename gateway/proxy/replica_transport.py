"""The gateway's own rollout calls (Tinker's and Weaver's samples, the served base model) go
over the registered replicas like a proxied `/v1/rollout/*` call: an httpx transport that
hands each request to `replica_proxy.send_routed`, so one client (`ServiceClient`, its errors
and request ids) and one routing path serve both."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import httpx2

from gateway.proxy.replicas import ReplicaRegistry
from gateway.proxy.routing import AFFINITY_HEADER
from gateway.proxy.send import send_routed
from gateway.proxy.target import proxy_target

# The request was built for the client's placeholder base URL: its Host names no replica, and
# the replica's own client frames the body it sends.
NOT_SENT = frozenset({b"host", b"content-length", b"transfer-encoding", b"connection"})
API_PREFIX_SEGMENTS = 1  # `/v1`


class ReplicaTransport(httpx2.AsyncBaseTransport):
    def __init__(self, registry: ReplicaRegistry) -> None:
        self.registry = registry

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        target = proxy_target(
            request.url.raw_path.decode("ascii").partition("?")[0],
            API_PREFIX_SEGMENTS,
            request.url.query.decode("ascii"),
        )
        headers = [
            (name, value) for name, value in request.headers.raw if name.lower() not in NOT_SENT
        ]
        sent = await send_routed(
            self.registry,
            request.method,
            target,
            headers,
            await request.aread() or None,
            request.headers.get(AFFINITY_HEADER),
        )
        return httpx2.Response(
            sent.response.status_code,
            headers=sent.response.headers.raw,
            stream=Released(sent.response, sent.release),
            extensions=sent.response.extensions,
        )


class Released(httpx2.AsyncByteStream):
    """The replica's bytes as they come (still encoded: the caller's response decodes them);
    closing it ends the call's count on the replica."""

    def __init__(self, response: httpx2.Response, release: Callable[[], Awaitable[None]]) -> None:
        self.response = response
        self.release = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.response.stream:  # type: ignore[union-attr]  # async: sent so
            yield chunk

    async def aclose(self) -> None:
        await self.release()
