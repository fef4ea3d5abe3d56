"""The rollout engine SIGKILLed in the middle of a managed GRPO run (`arith_grpo`, tiny: one
SFT check, then GRPO steps that each sample, score and publish): `loom up`'s supervisor
restarts it (a vLLM start, most of a minute), the run waits for it without failing or
spending retries, resumes from its last checkpoint and finishes, no version published twice."""

from __future__ import annotations

import os
import signal
import time

from tests.faults.conftest import (
    DONE,
    Deployment,
    published_steps,
    task_of,
)

USED = ("modelstate", "trainer", "rollout", "reward", "gateway", "worker")
RL_STEPS, KILL_AT = 8, 4  # steps 1 (the SFT check) .. 1 + RL_STEPS, each a version
GRPO = {
    "recipe": "arith_grpo",
    "config": {
        "held_out": 4,
        "validation": 4,
        "sft_min_steps": 1,
        "sft_check_every": 1,
        "sft_max_steps": 1,
        "sft_batch": 4,
        "rl_steps": RL_STEPS,
        "prompts_per_step": 2,
        "group_size": 2,
        "eval_every": RL_STEPS,
    },
}


def test_a_managed_run_waits_through_a_rollout_restart(deployment: Deployment) -> None:
    with deployment.supervise(USED) as stack, deployment.client() as http:
        job = http.post("/v1/jobs", json={"base_model": "loom/tiny", "mode": "lora"}).json()
        task = http.post(
            f"/v1/jobs/{job['id']}/tasks", json={"kind": "recipe", "params": GRPO}
        ).json()
        killed = False
        deadline = time.monotonic() + 600
        while (seen := task_of(http, task["id"]) or {}).get("status") not in DONE:
            assert time.monotonic() < deadline and stack.error is None, (stack.error, seen)
            if not killed and (seen.get("progress") or {}).get("step", 0) >= KILL_AT:
                os.killpg(stack.service("rollout").pid, signal.SIGKILL)
                killed = True
            time.sleep(0.2)
        assert seen["status"] == "succeeded", seen
        assert killed, "the run ended before the rollout engine could be killed"
        assert stack.service("rollout").restarts == 1
        # Attempt 2 resumed once the engine was ready again (the wait counted none) and ran
        # every step to the end. A step that trained nothing (every sample in a group scored
        # alike) republishes the weights it had: the same version, never a second one.
        assert (seen["attempts"], seen["progress"]["step"]) == (2, 1 + RL_STEPS), seen
        assert published_steps(http, job["id"])[0] == 1
        assert http.get(f"/v1/jobs/{job['id']}").json()["status"] == "completed"
