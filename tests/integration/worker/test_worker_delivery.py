"""At-least-once delivery, at-most-once execution: a message delivered again does nothing
once its task succeeded, nor while another delivery runs it (Redis's visibility timeout), and
a worker killed mid-task (SIGKILL) loses nothing: the task is delivered again (late acks) and
completes, on Redis and on the embedded filesystem broker."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from services.worker.app import create_celery, send
from services.worker.schemas import TaskKind
from services.worker.settings import WorkerSettings
from tests.support.worker import (
    WORKER_REDIS_URL,
    TaskStack,
    Worker,
    build_stack,
    wait_for_task,
)

DONE = {"succeeded", "failed", "cancelled"}


async def test_a_redelivered_message_of_a_succeeded_task_does_nothing(
    stack: TaskStack, queue: str
) -> None:
    stack.worker().start()
    async with stack.client() as http:
        job = await stack.create_job(http)
        task = (await http.post(f"/v1/jobs/{job}/tasks", json={"kind": "gc"})).json()
        task = await wait_for_task(http, task["id"], DONE)
        assert (task["status"], stack.gate.calls) == ("succeeded", 1)

        celery = create_celery(
            WorkerSettings(
                data_dir=stack.data_dir,
                worker_queue=queue,
                worker_redis_prefix=f"{queue}:",
                worker_broker_url=WORKER_REDIS_URL,
            )
        )
        for _ in range(2):  # the same operation id, delivered twice more
            send(celery, task["id"], TaskKind.gc, job, task["params"])
        celery.close()
        # One worker, one message at a time, in order: once this one is done, so are those.
        after = (await http.post(f"/v1/jobs/{job}/tasks", json={"kind": "gc"})).json()
        assert (await wait_for_task(http, after["id"], DONE))["status"] == "succeeded"
        again = (await http.get(f"/v1/tasks/{task['id']}")).json()
        assert (again["status"], again["attempts"], again["finished_at"]) == (
            "succeeded",
            1,
            task["finished_at"],
        )
        assert stack.gate.calls == 2  # the store collected once per task, not per message


async def held_gc(
    stack: TaskStack, worker: Worker, http: httpx2.AsyncClient
) -> tuple[str, dict[str, Any]]:
    """Start `worker`, submit a gc and hold it inside POST /v1/gc: its job and task."""
    worker.start()
    stack.gate.close()
    job = await stack.create_job(http)
    task = (await http.post(f"/v1/jobs/{job}/tasks", json={"kind": "gc"})).json()
    assert await asyncio.to_thread(stack.gate.entered.wait, 30)
    return job, task


def broker_messages(queue: str, task_id: str) -> int:
    """Messages of the task in Redis: waiting in its queue, or taken and not acknowledged."""
    import redis

    client = redis.Redis.from_url(WORKER_REDIS_URL)
    try:
        waiting = [json.loads(m) for m in client.lrange(f"{queue}:{queue}", 0, -1)]
        taken = [json.loads(m)[0] for m in client.hvals(f"{queue}:unacked")]
    finally:
        client.close()
    return sum(message["headers"]["id"] == task_id for message in waiting + taken)


async def test_a_message_redelivered_while_its_task_runs_is_dropped(
    stack: TaskStack, queue: str
) -> None:
    """Acks are late, so Redis gives a running task's message again once its visibility
    timeout (5 s here) passes, and a restart sends queued tasks again: such a duplicate meets
    the running attempt's live lease and is dropped. It counts no attempt, runs nothing, and
    leaves no message behind (no chain of messages polling the task)."""
    # A free process takes the duplicates; a lease of 6 s (3 heartbeats) outlives the 5 s
    # visibility timeout even on a loaded machine, so no sweep takes the task over meanwhile.
    worker = stack.worker(LOOM_WORKER_CONCURRENCY="2", LOOM_WORKER_HEARTBEAT_S="2")
    async with stack.client() as http:
        job, task = await held_gc(stack, worker, http)
        celery = create_celery(
            WorkerSettings(
                data_dir=stack.data_dir,
                worker_queue=queue,
                worker_redis_prefix=f"{queue}:",
                worker_broker_url=WORKER_REDIS_URL,
            )
        )
        send(celery, task["id"], TaskKind.gc, job, task["params"])  # as a restart resends it
        celery.close()

        def dropped() -> int:
            return worker.log_tail(400).count(f"task {task['id']} is running under another")

        deadline = time.monotonic() + 30  # then the visibility timeout's own redelivery
        while dropped() < 2:
            assert time.monotonic() < deadline, worker.log_tail()
            await asyncio.sleep(0.2)
        for _ in range(10):  # nothing left polling: at most the running delivery's message
            assert broker_messages(queue, task["id"]) <= 1
            await asyncio.sleep(0.2)
        running = (await http.get(f"/v1/tasks/{task['id']}")).json()
        assert (running["status"], running["attempts"]) == ("running", 1)

        stack.gate.opened.set()
        done = await wait_for_task(http, task["id"], DONE)
    assert (done["status"], done["attempts"], stack.gate.calls) == ("succeeded", 1, 1), done
    assert broker_messages(queue, task["id"]) == 0


async def kill_mid_task_and_recover(stack: TaskStack, kill: str) -> dict[str, object]:
    """Stop a gc inside POST /v1/gc, SIGKILL the worker (`whole`) or its pool process
    (`child`), let the gc go on, and return the task once done."""
    worker = stack.worker()
    async with stack.client() as http:
        _, task = await held_gc(stack, worker, http)
        if kill == "whole":
            worker.kill()
            assert (await http.get(f"/v1/tasks/{task['id']}")).json()["status"] == "running"
            stack.worker().start()
        else:
            [child] = worker.pool_children()
            os.kill(child.pid, signal.SIGKILL)
        stack.gate.opened.set()
        return await wait_for_task(http, task["id"], DONE)


@pytest.mark.parametrize("kill", ["whole", "child"])
async def test_a_worker_killed_mid_task_loses_nothing(stack: TaskStack, kill: str) -> None:
    task = await kill_mid_task_and_recover(stack, kill)
    assert (task["status"], task["attempts"]) == ("succeeded", 2), task
    assert stack.gate.calls == 2


@pytest.fixture
def embedded_stack(tmp_path: Path, tiny_model_dir: Path) -> Iterator[TaskStack]:
    """The embedded default: SQLite, and the filesystem broker under <data_dir>/celery."""
    yield from build_stack(tmp_path, f"sqlite:///{tmp_path / 'loom.db'}", tiny_model_dir, {})


async def test_the_embedded_filesystem_broker(embedded_stack: TaskStack) -> None:
    stack = embedded_stack
    task = await kill_mid_task_and_recover(stack, "whole")  # its message file is gone with it:
    assert (task["status"], task["attempts"]) == ("succeeded", 2), task  # sent again at start
    async with stack.client() as http:
        job = await stack.create_job(http)
        task = (
            await http.post(
                f"/v1/jobs/{job}/tasks", json={"kind": "gc", "params": {"keep_last": 2}}
            )
        ).json()
        assert (await wait_for_task(http, task["id"], DONE))["status"] == "succeeded"
    assert (stack.data_dir / "celery" / "queue").is_dir()
