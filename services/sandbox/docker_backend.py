"""The docker backend: programs run in containers from a warm pool, one program per container
at a time.

Each container runs `container_agent.py` (as root with only CAP_SETUID and CAP_SETGID) under
docker's init, with networking off, a read-only root, tmpfs /work and /tmp, memory, CPU and pids
limits, no new privileges. The agent starts each program as the unprivileged sandbox uid and,
after it, kills every process of that uid and empties the tmpfs, so the container goes back to
the pool as fresh as a new one. A container whose reset failed, whose agent stopped answering,
or that served `sandbox_docker_max_uses` programs is removed and replaced in the background.

Docker's Python SDK is blocking: its calls run on a thread pool sized to the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container

from services.common.errors import InvalidInput, Unavailable
from services.sandbox.outcome import MIB, classify, rlimits
from services.sandbox.schemas import ExecuteRequest, ExecuteResponse, ExecutionStatus
from services.sandbox.settings import SandboxSettings

log = logging.getLogger(__name__)

AGENT_SOURCE = (Path(__file__).parent / "container_agent.py").read_text()
POOL_LABEL = "loom.sandbox.pool"
PROBE_CODE = "import sys; print('%d.%d.%d' % sys.version_info[:3])"
# Beyond a program's own timeout: the agent's pipe drain and reset, and container start-up.
AGENT_GRACE_S = 5.0
HEADER = struct.Struct(">BxxxL")  # docker's multiplexed stream: stream id, payload length
STDOUT, STDERR = 1, 2


class AgentLost(Exception):
    """The container's agent died or stopped answering."""


class PooledContainer:
    """One container and the attached stdin/stdout of its agent. Blocking: call from a thread."""

    def __init__(self, container: Container, sock: Any) -> None:
        self.container = container
        self._sock = sock
        self._raw: socket.socket = sock._sock
        self._pending = bytearray()  # agent stdout not yet consumed
        self.uses = 0

    def exchange(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        self._raw.settimeout(timeout_s)
        try:
            self._raw.sendall(json.dumps(request).encode() + b"\n")
            deadline = time.monotonic() + timeout_s
            while b"\n" not in self._pending:
                self._raw.settimeout(max(deadline - time.monotonic(), 0.001))
                stream, payload = self._read_frame()
                if stream == STDOUT:
                    self._pending += payload
                else:
                    log.warning("sandbox agent %s: %s", self.container.short_id,
                                payload.decode(errors="replace").rstrip())
        except (OSError, TimeoutError) as exc:
            raise AgentLost(str(exc) or type(exc).__name__) from exc
        line, _, rest = self._pending.partition(b"\n")
        self._pending = bytearray(rest)
        self.uses += 1
        return dict(json.loads(line))

    def _read_frame(self) -> tuple[int, bytes]:
        header = self._read_exactly(HEADER.size)
        stream, length = HEADER.unpack(header)
        return stream, self._read_exactly(length)

    def _read_exactly(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = self._raw.recv(size - len(data))
            if not chunk:
                raise AgentLost("the agent's stream closed")
            data += chunk
        return bytes(data)

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(docker.errors.APIError):
            self.container.remove(force=True)


class DockerBackend:
    name = "docker"

    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings
        self.image = settings.sandbox_docker_image
        port = settings.sandbox_url.rsplit(":", 1)[-1].strip("/")
        self.pool_name = settings.sandbox_docker_pool or f"loom-sandbox-{port}"
        size = settings.sandbox_max_concurrency
        # One thread per container in use, plus room for replacements being created.
        self._threads = ThreadPoolExecutor(max_workers=2 * size + 2,
                                           thread_name_prefix="sandbox-docker")
        self._client: docker.DockerClient | None = None
        self._idle: asyncio.Queue[PooledContainer] = asyncio.Queue()
        self._replacements: set[asyncio.Task[None]] = set()
        self.python_version: str | None = None
        self.replaced = 0

    async def start(self) -> None:
        self._client = await self._call(self._connect)
        await self._call(self._remove_leftovers)
        containers = await asyncio.gather(
            *(self._call(self._create) for _ in range(self.settings.sandbox_max_concurrency)),
            return_exceptions=True)
        failed = [c for c in containers if isinstance(c, BaseException)]
        for container in containers:
            if isinstance(container, PooledContainer):
                self._idle.put_nowait(container)
        if failed:
            await self.aclose()
            raise RuntimeError(f"cannot start sandbox containers from {self.image}: {failed[0]}")
        probe = await self.execute(ExecuteRequest(code=PROBE_CODE, timeout_s=30))
        if probe.status is not ExecutionStatus.ok:
            await self.aclose()
            raise RuntimeError(f"python does not run in {self.image}: {probe.stderr[-300:]}")
        self.python_version = probe.stdout.strip()

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "image": self.image, "pool": self.pool_name,
                "python_version": self.python_version,
                "max_concurrency": self.settings.sandbox_max_concurrency,
                "idle_containers": self._idle.qsize(), "containers_replaced": self.replaced}

    async def execute(self, request: ExecuteRequest) -> ExecuteResponse:
        if self._client is None:
            raise Unavailable("the sandbox backend is not started")
        if request.memory_mb > self.settings.sandbox_docker_memory_mb:
            raise InvalidInput(f"memory_mb={request.memory_mb} is above this sandbox's limit of "
                               f"{self.settings.sandbox_docker_memory_mb} MiB per program")
        container = await self._idle.get()
        payload = {
            "code": request.code, "stdin": request.stdin, "timeout_s": request.timeout_s,
            "max_output_bytes": request.max_output_bytes,
            "overflow_bytes": self.settings.sandbox_output_overflow_bytes,
            "uid": self.settings.sandbox_docker_user_id,
            "limits": rlimits(request, self.settings, own_uid=True),
        }
        started = time.monotonic()
        try:
            reply = await self._call(container.exchange, payload,
                                     request.timeout_s + AGENT_GRACE_S)
        except AgentLost as exc:
            log.warning("sandbox container %s lost: %s", container.container.short_id, exc)
            oom = await self._call(_was_oom_killed, container.container)
            self._replace(container)
            wall_s = time.monotonic() - started
            status = ExecutionStatus.oom if oom else ExecutionStatus.killed
            return ExecuteResponse(status=status, exit_code=None, stdout="", stderr="",
                                   stdout_truncated=False, stderr_truncated=False,
                                   wall_s=round(wall_s, 6), cpu_s=0.0, reason="sandbox_lost")
        if reply["clean"] and container.uses < self.settings.sandbox_docker_max_uses:
            self._idle.put_nowait(container)
        else:
            self._replace(container)
        status, exit_code, signal_number = classify(reply["wait_status"], reply["reason"],
                                                    reply["stderr_tail"])
        return ExecuteResponse(
            status=status, exit_code=exit_code, signal=signal_number, reason=reply["reason"],
            stdout=reply["stdout"], stderr=reply["stderr"],
            stdout_truncated=reply["stdout_truncated"], stderr_truncated=reply["stderr_truncated"],
            wall_s=round(reply["wall_s"], 6), cpu_s=round(reply["cpu_s"], 6),
        )

    async def aclose(self) -> None:
        for task in list(self._replacements):
            task.cancel()
        await asyncio.gather(*self._replacements, return_exceptions=True)
        if self._client is not None:
            await self._call(self._remove_leftovers)
            self._client.close()
            self._client = None
        self._threads.shutdown(wait=False, cancel_futures=True)

    # -- containers --------------------------------------------------------------------------

    def _connect(self) -> docker.DockerClient:
        try:
            client = docker.DockerClient(base_url=self.settings.sandbox_docker_url, timeout=60)
            client.ping()
        except docker.errors.DockerException as exc:
            raise RuntimeError(f"the Docker daemon at {self.settings.sandbox_docker_url} does "
                               f"not answer: {exc}") from exc
        try:
            client.images.get(self.image)
        except docker.errors.ImageNotFound as exc:
            raise RuntimeError(f"the sandbox image {self.image} is missing: build it with "
                               "docker/ensure-images.sh (see the README)") from exc
        return client

    def _create(self) -> PooledContainer:
        assert self._client is not None
        settings = self.settings
        uid = settings.sandbox_docker_user_id
        tmpfs = f"size={settings.sandbox_tmp_mb}m,uid={uid},gid={uid},mode=0700"
        container = self._client.containers.create(
            self.image,
            command=["python3", "-I", "-S", "-c", AGENT_SOURCE],
            user="0:0",
            stdin_open=True,
            init=True,
            network_mode="none",
            read_only=True,
            tmpfs={"/work": tmpfs, "/tmp": tmpfs},
            working_dir="/",
            cap_drop=["ALL"],
            cap_add=["SETUID", "SETGID"],
            security_opt=["no-new-privileges"],
            pids_limit=settings.sandbox_max_processes + 8,  # + init, the agent and its helpers
            mem_limit=settings.sandbox_docker_memory_mb * MIB,
            memswap_limit=settings.sandbox_docker_memory_mb * MIB,
            nano_cpus=int(settings.sandbox_docker_cpus * 1e9),
            labels={POOL_LABEL: self.pool_name},
            environment={"PATH": "/usr/local/bin:/usr/bin:/bin"},
        )
        try:
            sock = container.attach_socket(params={"stdin": 1, "stdout": 1, "stderr": 1,
                                                   "stream": 1})
            container.start()
        except BaseException:
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)
            raise
        return PooledContainer(container, sock)

    def _replace(self, old: PooledContainer) -> None:
        self.replaced += 1

        async def replace() -> None:
            await self._call(old.remove)
            while True:
                try:
                    self._idle.put_nowait(await self._call(self._create))
                    return
                except docker.errors.DockerException as exc:
                    log.error("cannot create a sandbox container (retrying): %s", exc)
                    await asyncio.sleep(1.0)

        task = asyncio.get_running_loop().create_task(replace())
        self._replacements.add(task)
        task.add_done_callback(self._replacements.discard)

    def _remove_leftovers(self) -> None:
        """Containers of this pool from a previous run of the service (a crash leaves them)."""
        assert self._client is not None
        for container in self._client.containers.list(
                all=True, filters={"label": f"{POOL_LABEL}={self.pool_name}"}):
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)

    async def _call(self, function: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._threads, function, *args)


def _was_oom_killed(container: Container) -> bool:
    with contextlib.suppress(docker.errors.APIError):
        container.reload()
        return bool(container.attrs["State"].get("OOMKilled"))
    return False


def docker_available(settings: SandboxSettings) -> str | None:
    """None if the docker backend can run here, else why not (for `auto`)."""
    try:
        client = docker.DockerClient(base_url=settings.sandbox_docker_url, timeout=5)
    except docker.errors.DockerException as exc:
        return f"no Docker daemon ({exc})"
    try:
        client.ping()
        client.images.get(settings.sandbox_docker_image)
    except docker.errors.ImageNotFound:
        return f"image {settings.sandbox_docker_image} missing (docker/ensure-images.sh)"
    except docker.errors.DockerException as exc:
        return f"no Docker daemon ({exc})"
    finally:
        client.close()
    return None
