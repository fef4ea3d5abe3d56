"""Pooled HTTP transports whose check of idle connections costs a system call, not a dict.

Whenever a request starts or ends, httpcore2's pool asks each idle connection whether its
socket has turned readable (the server closed it, so it must not be reused). httpcore2 asks
anyio, which builds a dict of every attribute of the socket to answer one lookup. A burst of
n concurrent requests over n pooled connections (the SDK sending 64 samples at once, the
gateway proxying them) built about n² of those dicts: with 64, a third of the client's CPU
per request. Here each stream keeps its socket and polls it directly.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Iterable
from typing import Any

import httpcore2
import httpx2
from httpcore2 import AnyIOBackend, AsyncNetworkBackend, AsyncNetworkStream

from services.common.tracing import traced


def socket_readable(sock: socket.socket | None) -> bool:
    """Whether a read would return at once: data, or the b"" of a closed connection (a
    socket that is gone counts as closed)."""
    fd = -1 if sock is None else sock.fileno()
    if fd < 0:
        return True
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    return bool(poll.poll(0))


class ProbedStream(AsyncNetworkStream):
    """A network stream that answers `is_readable` from its own socket."""

    def __init__(self, inner: AsyncNetworkStream) -> None:
        self.inner = inner
        self.socket: socket.socket | None = inner.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self.inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self.inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> ProbedStream:
        return ProbedStream(await self.inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            return socket_readable(self.socket)
        return self.inner.get_extra_info(info)


class ProbedBackend(AsyncNetworkBackend):
    """anyio's backend (what httpcore2 picks under asyncio), with `ProbedStream`s."""

    def __init__(self) -> None:
        self.inner = AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> ProbedStream:
        return ProbedStream(
            await self.inner.connect_tcp(host, port, timeout, local_address, socket_options)
        )

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> ProbedStream:
        return ProbedStream(await self.inner.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def pooled_transport(limits: httpx2.Limits) -> httpx2.AsyncBaseTransport:
    """httpx2's transport with `limits`, its pool on `ProbedBackend`; traced (a client span
    per request, the trace context sent along) when tracing is on."""
    transport = httpx2.AsyncHTTPTransport(limits=limits)
    # httpx2 builds the pool itself and takes no network backend: hand it ours. Fail loudly
    # if a new httpx2 moves the pool rather than silently keep the slow probe.
    pool = getattr(transport, "_pool", None)
    if not isinstance(pool, httpcore2.AsyncConnectionPool) or not hasattr(pool, "_network_backend"):
        raise RuntimeError(
            "httpx2's transport no longer keeps its pool in `_pool`: update "
            "services/common/http_pool.py"
        )
    pool._network_backend = ProbedBackend()
    return traced(transport)
