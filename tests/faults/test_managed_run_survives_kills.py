"""Faults an operator meets every day, injected into a managed run on the real stack: every
service a real process under `loom up`'s supervisor (which restarts what dies), PostgreSQL and
Redis. Each service the run uses is killed with SIGKILL in turn, mid-run; the run must finish
with no manual retry, its versions one per checkpoint step, contiguous and never published
twice, and nothing left stuck. The rollout engine's kill is test_rollout_kill.py (a GRPO run:
SFT needs no engine), the whole stack's is test_stack_restart.py."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import httpx2

from tests.faults.conftest import DONE, Deployment, published_steps

# The SFT recipe needs the trainer, the store, the gateway and a worker: no rollout engine.
USED = ("modelstate", "trainer", "gateway", "worker")
STEPS, EVERY = 240, 10
KILLS = {60: "trainer", 120: "modelstate", 180: "worker"}  # at progress step -> service
DATA = [{"input_ids": list(range(3, 3 + 24)), "loss_mask": [0] * 4 + [1] * 20}] * 4
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


def test_a_managed_run_finishes_through_a_kill_of_each_service(deployment: Deployment) -> None:
    with deployment.supervise(USED) as stack, deployment.client() as http:
        job = http.post("/v1/jobs", json={"base_model": "loom/tiny", "mode": "lora"}).json()
        task = http.post(
            f"/v1/jobs/{job['id']}/tasks", json={"kind": "recipe", "params": SFT}
        ).json()
        pending, killed_at = dict(KILLS), {}
        deadline = time.monotonic() + 600
        seen: dict[str, Any] = {}
        while time.monotonic() < deadline:
            assert stack.error is None, stack.error
            try:
                seen = http.get(f"/v1/tasks/{task['id']}").json()
            except httpx2.TransportError:  # the gateway is never killed; a slow answer
                continue
            if seen["status"] in DONE:
                break
            step = (seen.get("progress") or {}).get("step", 0)
            for at in sorted(pending):
                if step >= at and all(stack.service(name).state == "ready" for name in USED):
                    name = pending.pop(at)
                    os.killpg(stack.service(name).pid, signal.SIGKILL)
                    killed_at[name] = time.monotonic()
            time.sleep(0.2)
        assert seen.get("status") == "succeeded", (
            str(seen.get("error")),
            seen.get("attempts"),
            seen.get("progress"),
            killed_at,
        )
        assert not pending, f"the run ended before {pending} could be killed"
        assert published_steps(http, job["id"]) == list(range(EVERY, STEPS + 1, EVERY))
        assert http.get(f"/v1/jobs/{job['id']}").json()["status"] == "completed"
    for name in KILLS.values():
        assert stack.service(name).restarts == 1, name
