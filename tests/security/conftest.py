"""A running sandbox service per backend, plus the bait hostile programs go after: a secret
file and a secret environment variable of the service, and host sockets on loopback."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest

from services.sandbox.app import create_app
from services.sandbox.settings import SandboxSettings
from tests.conftest import CACHE
from tests.support.sandboxes import BACKENDS, sandbox_settings

SECRET_ENV = "LOOM_TEST_SECRET_TOKEN"


@dataclass
class Bait:
    secret: str  # in a 0600 file of the service's user and in the service's environment
    secret_file: Path
    tcp: socket.socket  # listening on the host's loopback
    udp: socket.socket

    @property
    def tcp_port(self) -> int:
        return int(self.tcp.getsockname()[1])

    @property
    def udp_port(self) -> int:
        return int(self.udp.getsockname()[1])

    def host_was_reached(self) -> bool:
        for sock in (self.tcp, self.udp):
            try:
                if sock is self.tcp:
                    sock.accept()[0].close()
                else:
                    sock.recvfrom(65536)
                return True
            except BlockingIOError:
                pass
        return False


@dataclass
class Sandbox:
    backend: str
    settings: SandboxSettings
    client: httpx2.AsyncClient
    app_state: object


@pytest.fixture(scope="module")
def bait() -> Iterator[Bait]:
    secret = secrets.token_hex(16)
    directory = CACHE / "security"
    directory.mkdir(parents=True, exist_ok=True)
    secret_file = directory / "service-secret.txt"
    secret_file.write_text(secret)
    secret_file.chmod(0o600)
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    for sock in (tcp, udp):
        sock.setblocking(False)
    previous = os.environ.get(SECRET_ENV)
    os.environ[SECRET_ENV] = secret
    try:
        yield Bait(secret, secret_file, tcp, udp)
    finally:
        tcp.close()
        udp.close()
        secret_file.unlink(missing_ok=True)
        if previous is None:
            os.environ.pop(SECRET_ENV, None)
        else:
            os.environ[SECRET_ENV] = previous


@pytest.fixture(scope="module", params=BACKENDS)
async def sandbox(request: pytest.FixtureRequest, bait: Bait) -> AsyncIterator[Sandbox]:
    settings = sandbox_settings(request.param, sandbox_max_concurrency=2)
    app = create_app(settings)
    async with app.router.lifespan_context(app), httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=app), base_url="http://sandbox", timeout=60
    ) as client:
        yield Sandbox(request.param, settings, client, app.state)
