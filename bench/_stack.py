"""The real local stack for benchmarks: every service as a process on free ports (the same
supervisor `loom up` uses), optionally with services pinned to CPU cores."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx2
import psutil

from cli.supervisor import Supervisor, terminate_on_sigterm
from services.common.ports import free_port
from services.common.settings import SERVICES, LoomSettings


@dataclass
class LocalStack:
    settings: LoomSettings
    api_key: str
    supervisor: Supervisor

    def pid(self, service: str) -> int:
        return next(s.pid for s in self.supervisor.services if s.name == service)

    def counter(self, service: str, name: str) -> float:
        """A counter's value from the service's own /metrics."""
        text = httpx2.get(f"{self.settings.url_of(service)}/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith(f"{name} ") or line.startswith(f"{name}{{"):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(f"{service} exports no {name}")


def pin_threads(pid: int, cores: Sequence[int]) -> None:
    """Move every thread of a running process to `cores` (an affinity set on a process moves
    only its main thread; a started service has several, and threads it starts later inherit
    the affinity of the thread that starts them)."""
    for thread in psutil.Process(pid).threads():
        with suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(thread.id, cores)


@contextmanager
def local_stack(
    work: Path,
    env: Mapping[str, str] | None = None,
    cores: Mapping[str, Sequence[int]] | None = None,
) -> Iterator[LocalStack]:
    """`cores`: service → the CPU cores its process (and every process it starts) may use;
    set at launch, before a service spawns anything (its imports alone take seconds)."""
    terminate_on_sigterm()  # a bench killed with SIGTERM stops its stack too
    data_dir = Path(tempfile.mkdtemp(dir=work, prefix="stack-"))
    urls = {f"{name}_url": f"http://127.0.0.1:{free_port()}" for name in SERVICES}
    settings = LoomSettings(data_dir=data_dir, **urls)
    with Supervisor(settings, extra_env=dict(env or {})) as supervisor:
        supervisor.launch()
        for service in supervisor.services:
            if cores and service.name in cores:
                psutil.Process(service.pid).cpu_affinity(list(cores[service.name]))
        supervisor.wait_ready()
        key = (data_dir / "admin_key").read_text().strip()
        yield LocalStack(settings, key, supervisor)


async def until_ready(
    client: httpx2.AsyncClient, process: subprocess.Popen[bytes], what: str, timeout_s: float
) -> None:
    """Wait for a service process's `/readyz`; a RuntimeError if it exits or takes too long."""
    deadline = time.monotonic() + timeout_s
    while True:
        with suppress(httpx2.TransportError):
            if (await client.get("/readyz")).status_code == 200:
                return
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the {what} did not start")
        await asyncio.sleep(0.2)
