"""The whole `loom up` killed mid-run (every service and the supervisor, SIGKILL at once) and
started again over the same data directory, PostgreSQL database and Redis queue: the managed
run resumes from its last checkpoint by itself and finishes, each checkpoint published once,
in one more attempt only (the task's old message, redelivered by Redis, and the new worker's
resend of the lost task are one delivery, not two)."""

from __future__ import annotations

import time

from tests.faults.conftest import (
    DONE,
    Deployment,
    crash,
    published_steps,
    task_of,
)
from tests.faults.test_managed_run_survives_kills import DATA, USED

STEPS, EVERY, KILL_AT = 60, 10, 20
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


def test_a_managed_run_resumes_after_the_whole_stack_restarts(deployment: Deployment) -> None:
    with deployment.supervise(USED) as stack, deployment.client() as http:
        job = http.post("/v1/jobs", json={"base_model": "loom/tiny", "mode": "lora"}).json()
        task = http.post(
            f"/v1/jobs/{job['id']}/tasks", json={"kind": "recipe", "params": SFT}
        ).json()
        deadline = time.monotonic() + 300
        while ((task_of(http, task["id"]) or {}).get("progress") or {}).get("step", 0) < KILL_AT:
            assert time.monotonic() < deadline and stack.error is None, stack.error
            time.sleep(0.2)
        crash(stack)
    with deployment.supervise(USED) as stack, deployment.client() as http:
        deadline = time.monotonic() + 300
        while (seen := task_of(http, task["id"]) or {}).get("status") not in DONE:
            assert time.monotonic() < deadline and stack.error is None, (stack.error, seen)
            time.sleep(0.2)
        assert seen["status"] == "succeeded", seen
        assert (seen["attempts"], seen["result"]["attempts"]) == (2, 2), seen
        assert seen["progress"]["step"] == STEPS
        assert published_steps(http, job["id"]) == list(range(EVERY, STEPS + 1, EVERY))
        assert http.get(f"/v1/jobs/{job['id']}").json()["status"] == "completed"
