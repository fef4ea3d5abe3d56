"""Short outages in the middle of a managed SFT run on the real stack (`loom up`'s supervisor,
PostgreSQL, Redis), as an operator meets them every day:

- the database's connections dropped, again and again, through a TCP proxy the test controls
  (every service's database URL points at it; the shared server is never stopped): an error
  of the database is an outage, never a bug of the run's;
- six short outages of one service (modelstate SIGKILLed, restarted by the supervisor): more
  than the worker's retry budget (LOOM_WORKER_MAX_RETRIES=5), which only counts attempts in a
  row that failed with every service ready and starts again at each checkpoint.

Each run must finish with no manual retry, one version per checkpoint step, contiguous and
never published twice, and nothing left running."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from cli import supervisor
from cli.supervisor import SupervisionThread
from tests.faults.conftest import DONE, Deployment, published_steps, task_of
from tests.faults.test_managed_run_survives_kills import DATA, USED
from tests.support.tcp_proxy import tcp_proxy

STEPS, EVERY = 120, 5
SFT = {
    "recipe": "sft",
    "config": {
        "data": DATA,
        "steps": STEPS,
        "checkpoint_every": EVERY,
        "batch_size": 4,
        "adam": {"lr": 0.01},
    },
}
DROPS, DROP_EVERY_S = 30, 0.33  # 30 dropped connections over ~10 s
OUTAGES = (15, 30, 45, 60, 75, 90)  # progress steps at which modelstate is killed


def _finished(
    deployment: Deployment,
    task_id: str,
    stack: SupervisionThread,
    on_step: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Poll the task until it ends, calling `on_step(step)` on each progress seen."""
    deadline = time.monotonic() + 600
    with deployment.client() as http:
        while (seen := task_of(http, task_id) or {}).get("status") not in DONE:
            assert time.monotonic() < deadline and stack.error is None, (stack.error, seen)
            if on_step is not None:
                on_step((seen.get("progress") or {}).get("step", 0))
            time.sleep(0.2)
    return seen


def _start(deployment: Deployment) -> tuple[str, str]:
    with deployment.client() as http:
        job = http.post("/v1/jobs", json={"base_model": "loom/tiny", "mode": "lora"}).json()
        task = http.post(
            f"/v1/jobs/{job['id']}/tasks", json={"kind": "recipe", "params": SFT}
        ).json()
    return job["id"], task["id"]


def _check_done(deployment: Deployment, job_id: str, seen: dict[str, Any]) -> None:
    assert seen["status"] == "succeeded", seen
    assert seen["progress"]["step"] == STEPS and seen["error"] is None, seen
    with deployment.client() as http:
        assert published_steps(http, job_id) == list(range(EVERY, STEPS + 1, EVERY))
        assert http.get(f"/v1/jobs/{job_id}").json()["status"] == "completed"


def test_a_managed_run_finishes_through_dropped_database_connections(
    deployment: Deployment,
) -> None:
    url = deployment.settings.database_url
    assert url is not None and ":5432/" in url, url
    with tcp_proxy("127.0.0.1", 5432) as proxy:
        proxied = Deployment(
            deployment.settings.model_copy(
                update={"database_url": url.replace(":5432/", f":{proxy.port}/")}
            ),
            deployment.env,
        )
        with proxied.supervise(USED) as stack:
            job_id, task_id = _start(proxied)
            dropped: list[float] = []

            def drop(step: int) -> None:
                if step >= EVERY and not dropped:  # once, a checkpoint in
                    for _ in range(DROPS):
                        proxy.cut()
                        time.sleep(0.05)
                        proxy.restore()
                        dropped.append(time.monotonic())
                        time.sleep(DROP_EVERY_S - 0.05)

            seen = _finished(proxied, task_id, stack, drop)
            assert len(dropped) == DROPS, "the run ended before the drops"
            _check_done(proxied, job_id, seen)
            # A drop ends at most the attempt it hits (pooled connections are checked before
            # use; the task's row is claimed again once the database answers).
            assert seen["attempts"] <= 1 + DROPS, seen
            assert all(stack.service(name).restarts == 0 for name in USED)
    print(f"database: {DROPS} drops, attempts {seen['attempts']}")


def test_a_managed_run_finishes_through_six_short_outages_of_one_service(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The supervisor stops the stack at its 5th death in 10 minutes (a crash loop) and doubles
    # its backoff per death: here, six deaths are the point, each a short outage.
    monkeypatch.setattr(supervisor, "MAX_DEATHS", len(OUTAGES) + 1)
    monkeypatch.setattr(supervisor, "MAX_RESTART_BACKOFF_S", 2.0)
    with deployment.supervise(USED) as stack:
        job_id, task_id = _start(deployment)
        pending, outages = list(OUTAGES), []
        killed_at = 0.0

        def kill(step: int) -> None:
            nonlocal killed_at
            service = stack.service("modelstate")
            if killed_at and service.state == "ready" and service.restarts == len(outages) + 1:
                outages.append(round(time.monotonic() - killed_at, 1))
                killed_at = 0.0
            # Another kill only once the run has made progress since the last one (a
            # checkpoint starts the retry count again) and the whole stack is ready.
            if (
                pending
                and step >= pending[0]
                and not killed_at
                and all(stack.service(name).state == "ready" for name in USED)
            ):
                pending.pop(0)
                os.killpg(service.pid, signal.SIGKILL)
                killed_at = time.monotonic()

        seen = _finished(deployment, task_id, stack, kill)
        assert not pending, f"the run ended before the outages at steps {pending}"
        _check_done(deployment, job_id, seen)
        # Each outage costs at most the attempt it interrupts; a wait for modelstate to be
        # ready again costs none.
        assert seen["attempts"] <= 1 + len(OUTAGES), seen
        assert stack.service("modelstate").restarts == len(OUTAGES)
    print(f"modelstate outages (kill to ready, s): {outages}, attempts {seen['attempts']}")
