"""The fault suite's deployment: `loom up`'s supervisor running real service processes over
PostgreSQL (a scratch database) and Redis (a queue and key prefix of the test's own), with
heartbeats and timeouts short enough for a test. A test may kill the whole stack and start it
again over the same data directory, database and queue (`Deployment.supervise` again)."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from cli.supervisor import STACK, SupervisionThread, Supervisor
from services.common.ports import free_port
from services.common.settings import SERVICES, LoomSettings
from tests.conftest import PG_ADMIN_URL, port_open, require
from tests.support.worker import WORKER_REDIS_URL

DONE = ("succeeded", "failed", "cancelled")


@dataclass
class Deployment:
    settings: LoomSettings
    env: dict[str, str]

    @contextlib.contextmanager
    def supervise(self, used: Sequence[str]) -> Iterator[SupervisionThread]:
        """The services in `used`, started and kept (a dead one is restarted)."""
        specs = [spec for spec in STACK if spec.name in used]
        with Supervisor(self.settings, specs, grace_s=5.0, extra_env=self.env) as supervisor:
            supervisor.start()
            with SupervisionThread(supervisor) as kept:
                yield kept

    def client(self) -> httpx2.Client:
        key = (self.settings.data_dir / "admin_key").read_text().strip()
        return httpx2.Client(
            base_url=self.settings.gateway_url,
            timeout=30,
            headers={"Authorization": f"Bearer {key}"},
        )


def crash(stack: SupervisionThread) -> None:
    """Every service of the stack SIGKILLed at once, its supervisor first (a host losing
    power, or `loom up` and all it runs killed)."""
    stack.__exit__(None, None, None)
    for service in stack.supervisor.services:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(service.pid, signal.SIGKILL)


def task_of(http: httpx2.Client, task_id: str) -> dict[str, Any] | None:
    """The task, or None while the gateway does not answer (restarting)."""
    try:
        response = http.get(f"/v1/tasks/{task_id}")
    except httpx2.TransportError:
        return None
    return dict(response.json()) if response.status_code == 200 else None


def published_steps(http: httpx2.Client, job_id: str) -> list[int]:
    """The steps of the job's versions, once checked that none was published twice: numbers
    1..n with no gap, no step twice."""
    versions = http.get(f"/v1/modelstate/jobs/{job_id}/versions").json()["versions"]
    steps = sorted(v["step"] for v in versions)
    assert len(set(steps)) == len(steps), steps
    assert sorted(v["number"] for v in versions) == list(range(1, len(steps) + 1))
    return steps


@pytest.fixture
def deployment(tmp_path: Path, postgres_template: str) -> Iterator[Deployment]:
    require(port_open("127.0.0.1", 6379), "Redis on 127.0.0.1:6379")
    from services.common.db import scratch_database

    with scratch_database(PG_ADMIN_URL, "loom_faults", template=postgres_template) as database_url:
        urls = {f"{name}_url": f"http://127.0.0.1:{free_port()}" for name in SERVICES}
        settings = LoomSettings(data_dir=tmp_path / "data", database_url=database_url, **urls)
        queue = f"loom-faults-{os.getpid()}-{free_port()}"
        env = {
            "LOOM_WORKER_BROKER_URL": WORKER_REDIS_URL,
            "LOOM_WORKER_QUEUE": queue,
            "LOOM_WORKER_REDIS_PREFIX": f"{queue}:",
            "LOOM_WORKER_VISIBILITY_TIMEOUT_S": "5",
            "LOOM_WORKER_HEARTBEAT_S": "1",
            "LOOM_WORKER_RETRY_BACKOFF_S": "0.5",
        }
        try:
            yield Deployment(settings, env)
        finally:
            _delete_keys(f"{queue}*")


def _delete_keys(pattern: str) -> None:
    import redis

    client = redis.Redis.from_url(WORKER_REDIS_URL)
    for key in client.scan_iter(match=pattern):
        client.delete(key)
    client.close()
