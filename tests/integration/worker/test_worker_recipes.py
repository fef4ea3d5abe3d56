"""Managed runs on a real worker, a real trainer and modelstate, PostgreSQL and Redis: the
`sft` recipe runs to the end with one version per checkpoint; a worker killed while a
checkpoint publishes, and a trainer restarted mid-run, both end in a run that resumed from its
last checkpoint and published every step exactly once; pausing holds a run between steps,
cancelling stops it; bad submits are refused with what to fix."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2

from tests.support.worker import TaskStack, wait_for_task

DONE = {"succeeded", "failed", "cancelled"}
DATA = [
    {"input_ids": [3, 4, 5, 6, 7, 8], "loss_mask": [0, 1, 1, 1, 1, 1]},
    {"input_ids": [9, 10, 11, 12], "loss_mask": [0, 0, 1, 1]},
]


def sft(steps: int, checkpoint_every: int) -> dict[str, Any]:
    return {
        "kind": "recipe",
        "params": {
            "recipe": "sft",
            "config": {
                "data": DATA,
                "steps": steps,
                "checkpoint_every": checkpoint_every,
                "batch_size": 2,
                "adam": {"lr": 0.02},
            },
        },
    }


async def submit(http: httpx2.AsyncClient, job_id: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await http.post(f"/v1/jobs/{job_id}/tasks", json=body)
    assert response.status_code == 202, response.text
    return dict(response.json())


async def version_steps(http: httpx2.AsyncClient, job_id: str) -> list[int]:
    response = await http.get(f"/v1/modelstate/jobs/{job_id}/versions")
    assert response.status_code == 200, response.text
    return sorted(v["step"] for v in response.json()["versions"])


async def job_status(http: httpx2.AsyncClient, job_id: str) -> str:
    return str((await http.get(f"/v1/jobs/{job_id}")).json()["status"])


async def progress_step(http: httpx2.AsyncClient, task_id: str) -> int | None:
    progress = (await http.get(f"/v1/tasks/{task_id}")).json()["progress"]
    return None if progress is None else int(progress["step"])


async def test_a_recipe_runs_to_the_end_publishing_one_version_per_checkpoint(
    run_stack: TaskStack,
) -> None:
    run_stack.worker().start()
    async with run_stack.client() as http:
        job_id = await run_stack.create_job(http)
        task = await submit(http, job_id, sft(steps=6, checkpoint_every=2))
        done = await wait_for_task(http, task["id"], DONE, timeout_s=180)
        assert done["status"] == "succeeded", done
        assert (done["result"]["steps"], done["result"]["attempts"]) == (6, 1)
        assert done["progress"]["step"] == 6
        assert done["progress"]["checkpoint"] == f"{task['id']}-a1-step-6"
        assert await version_steps(http, job_id) == [2, 4, 6]
        assert await job_status(http, job_id) == "completed"

        losses = (await http.get(f"/v1/jobs/{job_id}/metrics", params={"name": "sft/loss"})).json()[
            "series"
        ][0]
        assert losses["steps"] == [1, 2, 3, 4, 5, 6]
        assert losses["values"][-1] < losses["values"][0]
        assert done["result"]["summary"]["final_loss"] == losses["values"][-1]

        # The run's key acted for this job only and was revoked when the run ended.
        run_keys = [k for k in (await http.get("/v1/keys")).json()["keys"] if k["job_id"] == job_id]
        assert run_keys and all(k["revoked_at"] is not None for k in run_keys)


async def test_bad_submits_are_refused_with_what_to_fix(run_stack: TaskStack) -> None:
    async with run_stack.client() as http:
        job_id = await run_stack.create_job(http)
        unknown = await http.post(
            f"/v1/jobs/{job_id}/tasks",
            json={"kind": "recipe", "params": {"recipe": "no_such_recipe"}},
        )
        assert unknown.status_code == 422
        assert "registered: ['arith_grpo', 'sft']" in unknown.json()["error"]["message"]

        bad = sft(steps=0, checkpoint_every=1)
        invalid = await http.post(f"/v1/jobs/{job_id}/tasks", json=bad)
        assert invalid.status_code == 422
        assert "steps" in invalid.json()["error"]["message"]

        huge = sft(steps=1, checkpoint_every=1)
        huge["params"]["config"]["data"] = DATA * 200_000
        oversized = await http.post(f"/v1/jobs/{job_id}/tasks", json=huge)
        assert oversized.status_code == 422
        assert "bytes as JSON" in oversized.json()["error"]["message"]

        bob = (await http.post("/v1/keys", json={"name": "bob"})).json()["key"]
        async with run_stack.client(bob) as as_bob:
            foreign = await as_bob.post(
                f"/v1/jobs/{job_id}/tasks", json=sft(steps=1, checkpoint_every=1)
            )
            assert foreign.status_code == 404
        async with run_stack.client("loom_not-a-key") as anonymous:
            assert (
                await anonymous.post(
                    f"/v1/jobs/{job_id}/tasks", json=sft(steps=1, checkpoint_every=1)
                )
            ).status_code == 401

        neither = {"kind": "recipe", "params": {"recipe": "sft", "config": {"steps": 3}}}
        refused = await http.post(f"/v1/jobs/{job_id}/tasks", json=neither)
        assert refused.status_code == 422 and "either" in refused.json()["error"]["message"]

        first = await submit(http, job_id, sft(steps=2, checkpoint_every=1))  # no worker: queued
        second = await http.post(f"/v1/jobs/{job_id}/tasks", json=sft(steps=2, checkpoint_every=1))
        assert second.status_code == 409
        assert second.json()["error"]["detail"]["task_id"] == first["id"]
        listed = (await http.get(f"/v1/jobs/{job_id}/tasks")).json()["tasks"]
        assert [t["id"] for t in listed] == [first["id"]]  # nothing half-made

        await http.post(f"/v1/tasks/{first['id']}/cancel")
        await http.post(f"/v1/jobs/{job_id}/status", json={"status": "completed"})
        ended = await http.post(f"/v1/jobs/{job_id}/tasks", json=sft(steps=2, checkpoint_every=1))
        assert ended.status_code == 409 and "completed" in ended.json()["error"]["message"]


async def test_a_worker_killed_while_a_checkpoint_publishes_resumes_without_publishing_twice(
    run_stack: TaskStack,
) -> None:
    first_worker = run_stack.worker()
    first_worker.start()
    async with run_stack.client() as http:
        job_id = await run_stack.create_job(http)
        gate = run_stack.trainer_gate
        gate.path = f"/v1/models/{job_id}/save_weights"
        gate.close()  # the first checkpoint's publish is held
        task = await submit(http, job_id, sft(steps=8, checkpoint_every=2))
        assert await asyncio.to_thread(gate.entered.wait, 120)
        # Recorded before publishing: the resumed run knows step 2 is done.
        assert await progress_step(http, task["id"]) == 2
        first_worker.kill()
        gate.opened.set()  # the dead worker's publish may still land: it must not count twice

        run_stack.worker().start()
        done = await wait_for_task(http, task["id"], DONE, timeout_s=180)
        assert done["status"] == "succeeded", done
        assert done["attempts"] == 2 and done["result"]["attempts"] == 2
        assert await version_steps(http, job_id) == [2, 4, 6, 8]
        names = [
            c["name"]
            for c in (await http.get(f"/v1/trainer/models/{job_id}/checkpoints")).json()[
                "checkpoints"
            ]
        ]
        # Resumed from step 2's checkpoint; the run's series keeps its newest two.
        assert sorted(names) == sorted([f"{task['id']}-a2-step-6", f"{task['id']}-a2-step-8"])


async def test_a_trainer_restart_mid_run_resumes_from_the_last_checkpoint(
    run_stack: TaskStack,
) -> None:
    run_stack.worker().start()
    async with run_stack.client() as http:
        job_id = await run_stack.create_job(http)
        gate = run_stack.trainer_gate
        gate.path = f"/v1/models/{job_id}/forward_backward"
        gate.close(after=2)  # steps 1 and 2 train; step 3 is held after checkpoint 2
        task = await submit(http, job_id, sft(steps=6, checkpoint_every=2))
        assert await asyncio.to_thread(gate.entered.wait, 120)
        assert await progress_step(http, task["id"]) == 2

        await asyncio.to_thread(run_stack.trainer.stop)  # the model in its memory is gone
        gate.path = ""
        gate.opened.set()
        await asyncio.to_thread(run_stack.trainer.start)

        done = await wait_for_task(http, task["id"], DONE, timeout_s=180)
        assert done["status"] == "succeeded", done
        assert done["attempts"] >= 2
        assert await version_steps(http, job_id) == [2, 4, 6]
        model = (await http.get(f"/v1/trainer/models/{job_id}")).json()
        assert model["step"] == 6  # restored at 2, then four more optimizer steps


async def test_pausing_holds_a_run_between_steps_and_cancelling_the_job_stops_it(
    run_stack: TaskStack,
) -> None:
    run_stack.worker().start()
    async with run_stack.client() as http:
        job_id = await run_stack.create_job(http)
        paused = await http.post(f"/v1/jobs/{job_id}/status", json={"status": "paused"})
        assert paused.status_code == 200
        task = await submit(http, job_id, sft(steps=5, checkpoint_every=1))
        deadline = asyncio.get_running_loop().time() + 120
        while await progress_step(http, task["id"]) != 1:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # held at its first checkpoint while paused
        assert await progress_step(http, task["id"]) == 1
        assert (await http.get(f"/v1/tasks/{task['id']}")).json()["status"] == "running"

        await http.post(f"/v1/jobs/{job_id}/status", json={"status": "cancelled"})
        done = await wait_for_task(http, task["id"], DONE, timeout_s=60)
        assert done["status"] == "cancelled"
        assert "cancelled" in done["error"]["message"]
        assert await version_steps(http, job_id) == [1]

        # The worker is free again (one process): a next task runs.
        gc = await submit(http, job_id, {"kind": "gc"})
        assert (await wait_for_task(http, gc["id"], DONE))["status"] == "succeeded"


async def test_a_run_that_fails_for_good_fails_its_job_and_a_cancelled_run_cancels_its_job(
    run_stack: TaskStack,
) -> None:
    run_stack.worker().start()
    async with run_stack.client() as http:
        job_id = await run_stack.create_job(http)
        bad = sft(steps=3, checkpoint_every=1)
        bad["params"]["config"]["data"] = [{"input_ids": [3, 10**6], "loss_mask": [0, 1]}]
        task = await submit(http, job_id, bad)  # valid config; the trainer refuses the token
        done = await wait_for_task(http, task["id"], DONE, timeout_s=180)
        assert (done["status"], done["attempts"]) == ("failed", 1), done
        assert "vocabulary" in done["error"]["message"]
        assert await job_status(http, job_id) == "failed"
        # The job is over: a new run is not taken...
        again = await http.post(f"/v1/jobs/{job_id}/tasks", json=sft(steps=2, checkpoint_every=1))
        assert again.status_code == 409 and "failed" in again.json()["error"]["message"]
        # ...but retrying the run that failed it reopens it (an operator's retry after an
        # outage resumes the run), and the run failing again fails the job again.
        retried = await http.post(f"/v1/tasks/{task['id']}/retry")
        assert retried.status_code == 202, retried.text
        assert await job_status(http, job_id) == "running"
        done = await wait_for_task(http, task["id"], DONE, timeout_s=180)
        assert (done["status"], done["attempts"]) == ("failed", 2), done
        assert await job_status(http, job_id) == "failed"

        other = await run_stack.create_job(http)
        await http.post(f"/v1/jobs/{other}/status", json={"status": "paused"})  # held at step 1
        run = await submit(http, other, sft(steps=5, checkpoint_every=1))
        deadline = asyncio.get_running_loop().time() + 120
        while await progress_step(http, run["id"]) != 1:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.1)
        cancelled = await http.post(f"/v1/tasks/{run['id']}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        assert await job_status(http, other) == "cancelled"
