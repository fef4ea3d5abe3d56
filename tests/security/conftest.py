"""A running sandbox service per backend, plus the bait hostile programs go after: a secret
file and a secret environment variable of the service, host sockets on loopback, a unix socket
and world-readable files on the host, and a host process with a marked command line."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest

from services.common.service_token import service_headers
from services.sandbox.app import create_app
from services.sandbox.settings import SandboxSettings
from tests.conftest import CACHE
from tests.support.sandboxes import BACKENDS, sandbox_settings

SECRET_ENV = "LOOM_TEST_SECRET_TOKEN"
# A real host daemon's socket (CI's PostgreSQL trusts local connections: a door to the host).
POSTGRES_SOCKET = Path("/run/postgresql/.s.PGSQL.5432")


@dataclass
class Bait:
    secret: str  # in a 0600 file of the service's user and in the service's environment
    secret_file: Path
    tcp: socket.socket  # listening on the host's loopback
    udp: socket.socket
    unix: socket.socket  # listening at a world-writable path on the host
    world_readable: list[Path]  # files any host user may read, with the secret in them
    host_process: subprocess.Popen[bytes]  # its command line ends with `marker`
    marker: str

    @property
    def tcp_port(self) -> int:
        return int(self.tcp.getsockname()[1])

    @property
    def udp_port(self) -> int:
        return int(self.udp.getsockname()[1])

    @property
    def unix_path(self) -> str:
        return str(self.unix.getsockname())

    def host_was_reached(self) -> bool:
        for sock in (self.tcp, self.udp, self.unix):
            try:
                if sock is self.udp:
                    sock.recvfrom(65536)
                else:
                    sock.accept()[0].close()
                return True
            except BlockingIOError:
                pass
        return False

    def fill(self, code: str) -> str:
        """A hostile program's code with the bait's whereabouts filled in."""
        for name, value in {
            "SECRET_FILE": self.secret_file,
            "TCP_PORT": self.tcp_port,
            "UDP_PORT": self.udp_port,
            "UNIX_SOCKET": self.unix_path,
            "POSTGRES_SOCKET": POSTGRES_SOCKET,
            "WORLD_READABLE": [str(p) for p in self.world_readable],
            "HOST_PID": self.host_process.pid,
            "MARKER": self.marker,
        }.items():
            code = code.replace(f"@{name}@", str(value))
        return code


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
    host_dir = Path(tempfile.mkdtemp(prefix="loom-bait-"))
    host_dir.chmod(0o755)
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(host_dir / "bait.sock"))
    (host_dir / "bait.sock").chmod(0o777)
    unix.listen()
    for sock in (tcp, udp, unix):
        sock.setblocking(False)
    # World-readable, outside anything a sandbox is given: the project, /var, the host's /tmp.
    world_readable = [
        directory / "world-readable.txt"
        for directory in (CACHE / "security", Path("/var/tmp"), host_dir)
    ]
    for path in world_readable:
        path.write_text(secret)
        path.chmod(0o644)
    marker = f"loom-bait-{secrets.token_hex(8)}"
    host_process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", marker])
    previous = os.environ.get(SECRET_ENV)
    os.environ[SECRET_ENV] = secret
    try:
        yield Bait(secret, secret_file, tcp, udp, unix, world_readable, host_process, marker)
    finally:
        host_process.kill()
        host_process.wait()
        for sock in (tcp, udp, unix):
            sock.close()
        for path in [*world_readable, host_dir / "bait.sock"]:
            path.unlink(missing_ok=True)
        host_dir.rmdir()
        secret_file.unlink(missing_ok=True)
        if previous is None:
            os.environ.pop(SECRET_ENV, None)
        else:
            os.environ[SECRET_ENV] = previous


@pytest.fixture(scope="module", params=BACKENDS)
async def sandbox(request: pytest.FixtureRequest, bait: Bait) -> AsyncIterator[Sandbox]:
    settings = sandbox_settings(request.param, sandbox_max_concurrency=2)
    async with running_sandbox(settings) as (client, app_state):
        yield Sandbox(request.param, settings, client, app_state)


@contextlib.asynccontextmanager
async def running_sandbox(
    settings: SandboxSettings,
) -> AsyncIterator[tuple[httpx2.AsyncClient, object]]:
    """A sandbox service app and a client of it that sends the service token."""
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app),
            base_url="http://sandbox",
            timeout=60,
            headers=service_headers(settings),
        ) as client,
    ):
        yield client, app.state
