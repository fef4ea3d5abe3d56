"""One Loom service as a Ray actor: the actor runs the service as a process on its node
(`python -m <module>`, an HTTP service on that node's address, as on one host) and lives as long
as the process should. Ray places the actor by its resource request; the process dies with the
actor (through `cli.cluster.keeper`), and the actor's `stop` ends the process's whole
session (vLLM's engine processes included).

Imported by Ray's workers: this module must not import Ray at module level (the CLI imports it
only once Ray is there) nor anything heavy."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2

from services.common.service_token import SERVICE_TOKEN_HEADER
from services.rollout.client import DRAIN

DRAIN_GRACE_S = 1.0  # after a replica leaves the table: calls routed just before it arrive


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ServiceProcess:
    """`env` is the stack's environment; the actor adds the service's own URL (this node's
    address, a free port). `start_now`: a rollout replica starts in its constructor, so an
    actor Ray restarts on another node comes back by itself and announces its new URL."""

    def __init__(
        self, name: str, module: str, env: dict[str, str], log_dir: str, start_now: bool = False
    ) -> None:
        import ray  # in the actor's process, where Ray is running

        self.name = name
        self.module = module
        self.env = env
        self.host = ray.util.get_node_ip_address()
        self.url = f"http://{self.host}:{free_port(self.host)}"
        self.node_id = ray.get_runtime_context().get_node_id()
        self.log_path = Path(log_dir) / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        if start_now:
            self.start({})

    def where(self) -> dict[str, str]:
        return {"name": self.name, "url": self.url, "node_id": self.node_id}

    def gpu_ids(self) -> list[str]:
        return gpu_ids()

    def start(self, stack_env: dict[str, str]) -> str:
        """Start the service with the stack's URLs (`stack_env`) and this one's (once: a
        second `loom cluster up` finds it running)."""
        if self.alive():
            return self.url
        service = self.name.split("-", 1)[0]  # rollout-3 is a rollout service
        env = {**os.environ, **self.env, **stack_env, f"LOOM_{service.upper()}_URL": self.url}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cli.cluster.keeper", self.module],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self.url

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def drain(self, service_token: str) -> None:
        """A rollout replica leaves the gateway's table before it stops (scaling down)."""
        with contextlib.suppress(httpx2.HTTPError):
            httpx2.post(
                f"{self.url}{DRAIN.url()}",
                timeout=10,
                headers={SERVICE_TOKEN_HEADER: service_token},
            )
            time.sleep(DRAIN_GRACE_S)

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM (a graceful shutdown: running requests finish), then SIGKILL whatever is
        left in the service's session."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


class RankSlot:
    """Holds one bundle of the trainer's placement group for a rank the trainer starts itself
    (`cli.cluster.trainer_group`): it runs nothing, and tells which GPUs Ray gave it."""

    def __init__(self, name: str) -> None:
        import ray

        self.name = name
        self.node_id = ray.get_runtime_context().get_node_id()

    def where(self) -> dict[str, str]:
        return {"name": self.name, "url": "", "node_id": self.node_id}

    def alive(self) -> bool:
        return True

    def gpu_ids(self) -> list[str]:
        return gpu_ids()


def gpu_ids() -> list[str]:
    """The GPUs Ray assigned to this actor (its bundle's, in a placement group)."""
    import ray

    return [str(gpu) for gpu in ray.get_gpu_ids()]
