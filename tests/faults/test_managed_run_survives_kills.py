"""Faults an operator meets every day, injected into a managed run on the real stack: every
service a real process under `loom up`'s supervisor (which restarts what dies), PostgreSQL and
Redis. Each service the run uses is killed with SIGKILL in turn, mid-run; the run must finish
with no manual retry, its versions one per checkpoint step, contiguous and never published
twice, and nothing left stuck. The rollout engine's restart (a minute of vLLM start-up) is
covered by the worker's readiness waits (tests/integration/worker) rather than here, to keep
this suite's time in bounds."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from gateway.cli.supervisor import STACK, SupervisionThread, Supervisor
from services.common.ports import free_port
from services.common.settings import SERVICES, LoomSettings
from tests.conftest import PG_ADMIN_URL, port_open, require
from tests.support.worker import WORKER_REDIS_URL

pytestmark = pytest.mark.e2e
# The SFT recipe needs the trainer, the store, the gateway and a worker: no rollout engine.
USED = ("modelstate", "trainer", "gateway", "worker")
STEPS, EVERY = 240, 10
KILLS = {60: "trainer", 120: "modelstate", 180: "worker"}  # at progress step -> service
DATA = [{"input_ids": list(range(3, 3 + 24)), "loss_mask": [0] * 4 + [1] * 20}] * 4


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[tuple[SupervisionThread, LoomSettings]]:
    require(port_open("127.0.0.1", 5432), "PostgreSQL on 127.0.0.1:5432")
    require(port_open("127.0.0.1", 6379), "Redis on 127.0.0.1:6379")
    from services.common.db import scratch_database

    with scratch_database(PG_ADMIN_URL, "loom_faults") as database_url:
        urls = {f"{name}_url": f"http://127.0.0.1:{free_port()}" for name in SERVICES}
        settings = LoomSettings(data_dir=tmp_path / "data", database_url=database_url, **urls)
        queue = f"loom-faults-{os.getpid()}-{free_port()}"
        env = {"LOOM_WORKER_BROKER_URL": WORKER_REDIS_URL, "LOOM_WORKER_QUEUE": queue,
               "LOOM_WORKER_REDIS_PREFIX": f"{queue}:", "LOOM_WORKER_VISIBILITY_TIMEOUT_S": "5",
               "LOOM_WORKER_HEARTBEAT_S": "1", "LOOM_WORKER_RETRY_BACKOFF_S": "0.5"}
        specs = [spec for spec in STACK if spec.name in USED]
        with Supervisor(settings, specs, grace_s=5.0, extra_env=env) as supervisor:
            supervisor.start()
            with SupervisionThread(supervisor) as kept:
                yield kept, settings
        _delete_keys(f"{queue}*")


def _delete_keys(pattern: str) -> None:
    import redis

    client = redis.Redis.from_url(WORKER_REDIS_URL)
    for key in client.scan_iter(match=pattern):
        client.delete(key)
    client.close()


def test_a_managed_run_finishes_through_a_kill_of_each_service(
        supervised: tuple[SupervisionThread, LoomSettings]) -> None:
    stack, settings = supervised
    key = (settings.data_dir / "admin_key").read_text().strip()
    with httpx2.Client(base_url=settings.gateway_url, timeout=30,
                       headers={"Authorization": f"Bearer {key}"}) as http:
        job = http.post("/v1/jobs", json={"base_model": "loom/tiny", "mode": "lora"}).json()
        task = http.post(f"/v1/jobs/{job['id']}/tasks", json={
            "kind": "recipe", "params": {"recipe": "sft", "config": {
                "data": DATA, "steps": STEPS, "checkpoint_every": EVERY, "batch_size": 4,
                "adam": {"lr": 0.01}}}}).json()
        pending, killed_at = dict(KILLS), {}
        deadline = time.monotonic() + 600
        seen: dict[str, Any] = {}
        while time.monotonic() < deadline:
            assert stack.error is None, stack.error
            try:
                seen = http.get(f"/v1/tasks/{task['id']}").json()
            except httpx2.TransportError:  # the gateway is never killed; a slow answer
                continue
            if seen["status"] in ("succeeded", "failed", "cancelled"):
                break
            step = (seen.get("progress") or {}).get("step", 0)
            for at in sorted(pending):
                if step >= at and all(stack.service(name).state == "ready" for name in USED):
                    name = pending.pop(at)
                    os.killpg(stack.service(name).pid, signal.SIGKILL)
                    killed_at[name] = time.monotonic()
            time.sleep(0.2)
        assert seen.get("status") == "succeeded", (str(seen.get("error")), seen.get("attempts"),
                                                   seen.get("progress"), killed_at)
        assert not pending, f"the run ended before {pending} could be killed"
        versions = http.get(f"/v1/modelstate/jobs/{job['id']}/versions").json()["versions"]
        steps = sorted(v["step"] for v in versions)
        assert steps == list(range(EVERY, STEPS + 1, EVERY))  # contiguous, each once
        assert [v["number"] for v in sorted(versions, key=lambda v: v["number"])] == list(
            range(1, len(steps) + 1))
        assert http.get(f"/v1/jobs/{job['id']}").json()["status"] == "completed"
    for name in KILLS.values():
        assert stack.service(name).restarts == 1, name
