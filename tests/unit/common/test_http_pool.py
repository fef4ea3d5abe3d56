"""services/common/http_pool: pooled connections are reused, and one the server closed while it
sat idle is noticed by the cheap probe and never reused (real sockets on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from services.common.http import LIMITS, ServiceClient
from services.common.http_pool import ProbedBackend, pooled_transport, socket_readable

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}"


@dataclass
class KeepAliveServer:
    """Answers every request on a connection with `{}`; with `close_after_one`, closes each
    connection once its first response is sent (without saying so in the response)."""

    close_after_one: bool
    connections: int = 0
    requests: int = 0
    server: asyncio.Server | None = field(default=None, repr=False)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                self.requests += 1
                writer.write(RESPONSE)
                await writer.drain()
                if self.close_after_one:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


@pytest.fixture
async def server(request: pytest.FixtureRequest) -> AsyncIterator[KeepAliveServer]:
    served = KeepAliveServer(close_after_one=request.param)
    served.server = await asyncio.start_server(served.handle, "127.0.0.1", 0)
    yield served
    served.server.close()
    await served.server.wait_closed()


@pytest.mark.parametrize("server", [False], indirect=True)
async def test_a_burst_reuses_the_connections_of_the_burst_before(server: KeepAliveServer) -> None:
    client = ServiceClient(server.url, service="test")
    try:
        for _ in range(3):
            bodies = await asyncio.gather(*(client.get_json("/") for _ in range(16)))
            assert bodies == [{}] * 16
    finally:
        await client.aclose()
    assert server.requests == 48
    assert server.connections == 16


@pytest.mark.parametrize("server", [True], indirect=True)
async def test_a_connection_the_server_closed_while_idle_is_not_reused(
    server: KeepAliveServer,
) -> None:
    # One attempt only: a reused dead connection would fail the request, not be retried.
    client = ServiceClient(
        server.url, service="test", retries=0, transport=pooled_transport(LIMITS)
    )
    try:
        for _ in range(3):
            assert await client.post_json("/", {}) == {}
            await asyncio.sleep(0.05)  # the server's close reaches our socket
    finally:
        await client.aclose()
    assert server.connections == 3


def test_the_probe_sees_data_and_a_closed_peer_but_not_a_quiet_one() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert not socket_readable(ours)
        theirs.sendall(b"x")
        assert socket_readable(ours)
        ours.recv(1)
        theirs.close()
        assert socket_readable(ours)
    assert socket_readable(None)
    assert socket_readable(ours)  # closed: fileno() is -1


def test_the_pool_of_a_pooled_transport_probes_with_our_backend() -> None:
    transport = pooled_transport(LIMITS)
    assert isinstance(transport._pool._network_backend, ProbedBackend)  # type: ignore[attr-defined]
