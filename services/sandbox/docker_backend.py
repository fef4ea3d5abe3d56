"""The docker backend: each agent is a container from a warm pool.

Containers run `agent.py` (as root with only CAP_SETUID and CAP_SETGID) under docker's init,
with networking off, a read-only root, tmpfs /work and /tmp, memory, CPU and pids limits and no
new privileges. Programs run as the image's unprivileged uid with no capabilities; after each,
the agent kills that uid's processes and empties the tmpfs, so a container is reused as fresh as
a new one. Its stdin/stdout are attached over the Docker API: no network is involved.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from typing import Any

import docker
import docker.errors

from services.common.errors import InvalidInput
from services.sandbox.agent_pool import Agent, AgentBackend, AgentLost, agent_command
from services.sandbox.outcome import MIB
from services.sandbox.schemas import ExecuteRequest, ExecutionStatus
from services.sandbox.settings import SandboxSettings

POOL_LABEL = "loom.sandbox.pool"
HEADER = struct.Struct(">BxxxL")  # docker's multiplexed stream: stream id, payload length
STDOUT = 1


class ContainerAgent(Agent):
    def __init__(self, slot: int, uid: int, image: str, container: Any, attached: Any) -> None:
        super().__init__(slot, uid, image)
        self.container = container
        self._attached = attached
        self._socket: socket.socket = attached._sock

    def _send(self, data: bytes) -> None:
        self._socket.settimeout(30)
        self._socket.sendall(data)

    def _receive(self, timeout_s: float) -> bytes:
        self._socket.settimeout(timeout_s)
        try:
            stream, length = HEADER.unpack(self._read_exactly(HEADER.size))
            payload = self._read_exactly(length)
        except TimeoutError as exc:
            raise AgentLost("no answer in time") from exc
        return payload if stream == STDOUT else b""  # stderr: the agent's own crash report

    def _read_exactly(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = self._socket.recv(size - len(data))
            if not chunk:
                raise AgentLost("the container's stream closed")
            data += chunk
        return bytes(data)

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self._attached.close()
        with contextlib.suppress(docker.errors.APIError):
            self.container.remove(force=True)


class DockerBackend(AgentBackend):
    name = "docker"

    def __init__(self, settings: SandboxSettings) -> None:
        super().__init__(settings)
        port = settings.sandbox_url.rsplit(":", 1)[-1].strip("/")
        self.pool_name = settings.sandbox_docker_pool or f"loom-sandbox-{port}"
        self._client: docker.DockerClient | None = None

    def _prepare(self) -> None:
        # The default image was checked by _connect. A missing extra image costs only its own
        # pool: its slots fail to start with docker's error, shown in readiness, and start
        # once the image appears.
        self._client = _connect(self.settings, pool_size=self.workers)
        self._remove_pool()

    def _teardown(self) -> None:
        if self._client is not None:
            self._remove_pool()
            self._client.close()
            self._client = None

    def _check(self, request: ExecuteRequest) -> None:
        if request.memory_mb > self.settings.sandbox_docker_memory_mb:
            raise InvalidInput(
                f"memory_mb={request.memory_mb} is above this sandbox's limit of "
                f"{self.settings.sandbox_docker_memory_mb} MiB per program"
            )

    def _extra_description(self) -> dict[str, Any]:
        return {"images": self._images(), "pool": self.pool_name}

    def _images(self) -> list[str | None]:
        images = [self.settings.sandbox_docker_image, *self.settings.sandbox_docker_images]
        return list(dict.fromkeys(images))

    def _start_agent(self, slot: int, image: str | None) -> ContainerAgent:
        assert self._client is not None and image is not None
        settings = self.settings
        uid = settings.sandbox_docker_user_id
        tmpfs = f"size={settings.sandbox_tmp_mb}m,uid={uid},gid={uid},mode=0700"
        container = self._client.containers.create(
            image,
            command=agent_command("python3"),
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
            attached = container.attach_socket(
                params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            container.start()
        except BaseException:
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)
            raise
        return ContainerAgent(slot, uid, image, container, attached)

    def _lost_status(self, agent: Agent) -> ExecutionStatus:
        assert isinstance(agent, ContainerAgent)
        with contextlib.suppress(docker.errors.APIError):
            agent.container.reload()
            if agent.container.attrs["State"].get("OOMKilled"):
                return ExecutionStatus.oom
        return ExecutionStatus.killed

    def _remove_pool(self) -> None:
        """This pool's containers, including those a crashed earlier run left behind."""
        assert self._client is not None
        for container in self._client.containers.list(
            all=True, filters={"label": f"{POOL_LABEL}={self.pool_name}"}
        ):
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)


def _connect(settings: SandboxSettings, pool_size: int) -> docker.DockerClient:
    """A client with a connection for each thread that may use it at once: with docker's
    default of 10, starting a large pool discarded connections by the dozen."""
    why_not = docker_available(settings)
    if why_not:
        raise RuntimeError(f"the docker sandbox backend cannot run: {why_not}")
    return docker.DockerClient(
        base_url=settings.sandbox_docker_url, timeout=60, max_pool_size=pool_size
    )


def docker_available(settings: SandboxSettings) -> str | None:
    """None if the docker backend can run here, else why not (for `auto`)."""
    try:
        client = docker.DockerClient(base_url=settings.sandbox_docker_url, timeout=5)
    except docker.errors.DockerException as exc:
        return f"no Docker daemon at {settings.sandbox_docker_url} ({exc})"
    try:
        client.ping()
        client.images.get(settings.sandbox_docker_image)
    except docker.errors.ImageNotFound:
        return (
            f"the image {settings.sandbox_docker_image} is missing: build it with "
            "docker/ensure-images.sh (see the README)"
        )
    except docker.errors.DockerException as exc:
        return f"no Docker daemon at {settings.sandbox_docker_url} ({exc})"
    finally:
        client.close()
    return None
