"""Background tasks through the real gateway, broker (Redis), worker and modelstate: gc,
export, retry, cancel, ownership, bad input, and the SDK."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx2
import pytest
from pydantic import ValidationError

from agents.sdk import LoomClient, NotFound
from gateway.app import create_app
from gateway.settings import GatewaySettings
from modelstate.schemas import GcReport, VersionKind
from services.common.ports import free_port
from services.worker.schemas import GcParams, TaskKind
from services.worker.settings import WorkerSettings
from tests.support.adapters import lora_adapter
from tests.support.servers import serve_in_thread
from tests.support.worker import HEARTBEAT_S, TaskStack, wait_for_task

DONE = {"succeeded", "failed", "cancelled"}


def adapter_dir(tmp_path: Path, name: str, content: bytes) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "adapter_model.safetensors").write_bytes(content)
    return directory


async def test_gc_applies_retention_and_reports_the_jobs_deleted_versions(
    stack: TaskStack, tmp_path: Path
) -> None:
    stack.worker().start()
    async with stack.client() as http:
        job = await stack.create_job(http)
        other = await stack.create_job(http)
        for step in (1, 2, 3):
            await stack.publish(job, adapter_dir(tmp_path, f"a{step}", b"a%d" % step), step)
        await stack.publish(other, adapter_dir(tmp_path, "b1", b"b1"), 1)
        submitted = await http.post(
            f"/v1/jobs/{job}/tasks", json={"kind": "gc", "params": {"keep_last": 1}}
        )
        assert submitted.status_code == 202, submitted.text
        task = submitted.json()
        assert task["id"].startswith("task_")
        assert (task["status"], task["job_id"], task["kind"]) == ("queued", job, "gc")
        task = await wait_for_task(http, task["id"], DONE)
        assert task["status"] == "succeeded", task
        assert sorted(task["result"]["versions_deleted"]) == [f"{job}@1", f"{job}@2"]
        assert task["attempts"] == 1 and task["finished_at"] is not None
    client = stack.modelstate()
    try:
        assert [v.number for v in await client.list_versions(job)] == [3]
        assert [v.number for v in await client.list_versions(other)] == [1]
    finally:
        await client.aclose()


async def test_export_merges_a_lora_version_into_a_hugging_face_directory(
    stack: TaskStack, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    stack.worker().start()
    async with stack.client() as http:
        job = await stack.create_job(http)
        await stack.publish(job, lora_adapter(stack.base_model, tmp_path / "adapter"), step=5)
        submitted = await http.post(f"/v1/jobs/{job}/tasks", json={"kind": "export"})
        assert submitted.status_code == 202, submitted.text
        task = await wait_for_task(http, submitted.json()["id"], DONE, timeout_s=120)
    assert task["status"] == "succeeded", task
    result = task["result"]
    target = stack.data_dir / "exports" / job / "1"
    assert (result["version"], result["path"]) == (1, str(target))
    names = {f["path"] for f in result["files"]}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    assert not any(p.name.startswith(".tmp-") for p in target.parent.iterdir())
    merged = load_file(target / "model.safetensors")
    base = load_file(stack.base_model / "model.safetensors")
    query = next(name for name in base if name.endswith("q_proj.weight"))
    assert merged[query].shape == base[query].shape
    assert not torch_equal(merged[query], base[query])  # the adapter is in the weights


def torch_equal(a: object, b: object) -> bool:
    import torch

    return bool(torch.equal(a, b))  # type: ignore[arg-type]


async def test_user_faults_fail_at_once_and_a_failed_task_can_be_retried(
    stack: TaskStack, tmp_path: Path
) -> None:
    stack.worker().start()
    async with stack.client() as http:
        job = await stack.create_job(http)
        submitted = await http.post(f"/v1/jobs/{job}/tasks", json={"kind": "export"})
        task = await wait_for_task(http, submitted.json()["id"], DONE)
        assert (task["status"], task["attempts"]) == ("failed", 1)  # a 404: not retried
        assert task["error"]["code"] == "not_found", task
        assert "no published versions" in task["error"]["message"]

        full = await stack.publish(job, adapter_dir(tmp_path, "full", b"w"), 1, VersionKind.full)
        submitted = await http.post(f"/v1/jobs/{job}/tasks", json={"kind": "export"})
        refused = await wait_for_task(http, submitted.json()["id"], DONE)
        assert refused["status"] == "failed" and "only LoRA" in refused["error"]["message"]

        await stack.publish(job, lora_adapter(stack.base_model, tmp_path / "lora"), 2)
        again = await http.post(f"/v1/tasks/{task['id']}/retry")
        assert again.status_code == 202, again.text
        assert again.json()["status"] == "queued" and again.json()["error"] is None
        task = await wait_for_task(http, task["id"], DONE, timeout_s=120)
        assert (task["status"], task["attempts"]) == ("succeeded", 2)
        assert task["result"]["version"] == full.number + 1

        for action in ("retry", "cancel"):  # only failed tasks are retried; succeeded is final
            response = await http.post(f"/v1/tasks/{task['id']}/{action}")
            assert response.status_code == 409, response.text
            assert response.json()["error"]["code"] == "invalid_transition"


async def test_a_task_waits_out_an_outage_without_attempts_then_fails_past_the_window(
    stack: TaskStack,
) -> None:
    unreachable = f"http://127.0.0.1:{free_port()}"
    worker = stack.worker(LOOM_MODELSTATE_URL=unreachable, LOOM_WORKER_OUTAGE_WINDOW_S="4")
    worker.start()
    async with stack.client() as http:
        job = await stack.create_job(http)
        submitted = await http.post(f"/v1/jobs/{job}/tasks", json={"kind": "gc"})
        task = await wait_for_task(http, submitted.json()["id"], DONE)
        # The store was not ready from the start: the task waited, claiming nothing.
        assert (task["status"], task["attempts"]) == ("failed", 0)
        assert task["error"]["code"] == "unavailable"
        assert task["error"]["message"].startswith("Gave up: services not ready for"), task
        assert "modelstate: unreachable" in task["error"]["message"]
        worker.stop()
        stack.worker().start()  # the store is reachable again
        assert (await http.post(f"/v1/tasks/{task['id']}/retry")).status_code == 202
        task = await wait_for_task(http, task["id"], DONE)
        assert (task["status"], task["attempts"]) == ("succeeded", 1)


async def test_a_task_resumes_when_its_service_comes_back(stack: TaskStack) -> None:
    """The store is down when the task starts and comes back within the outage window: the
    task waits for it (saying so) and then succeeds, with no manual retry."""
    port = free_port()
    worker = stack.worker(LOOM_MODELSTATE_URL=f"http://127.0.0.1:{port}")
    worker.start()
    async with stack.client() as http:
        job = await stack.create_job(http)
        submitted = await http.post(f"/v1/jobs/{job}/tasks", json={"kind": "gc"})
        waiting = await wait_for_task(
            http,
            submitted.json()["id"],
            lambda t: (
                t["status"] == "queued"
                and t["error"] is not None
                and t["error"]["message"].startswith("Waiting for services: modelstate")
            ),
        )
        assert waiting["attempts"] == 0  # no attempt spent on a store that is down
        with stack.modelstate_at(port):
            task = await wait_for_task(http, waiting["id"], DONE, timeout_s=60)
        assert (task["status"], task["attempts"]) == ("succeeded", 1), task


async def test_cancel_a_queued_and_a_running_task(stack: TaskStack) -> None:
    async with stack.client() as http:
        job = await stack.create_job(http)
        queued = (await http.post(f"/v1/jobs/{job}/tasks", json={"kind": "gc"})).json()
        cancelled = await http.post(f"/v1/tasks/{queued['id']}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"

        stack.gate.close()  # the next gc stops inside POST /v1/gc
        stack.worker().start()  # takes the cancelled task's message first: it does nothing
        running = (await http.post(f"/v1/jobs/{job}/tasks", json={"kind": "gc"})).json()
        assert await asyncio.to_thread(stack.gate.entered.wait, 30)
        assert (await http.get(f"/v1/tasks/{running['id']}")).json()["status"] == "running"
        assert (await http.post(f"/v1/tasks/{running['id']}/cancel")).status_code == 200
        await asyncio.sleep(3 * HEARTBEAT_S)  # the worker notices at its next heartbeat
        stack.gate.opened.set()

        after = (await http.post(f"/v1/jobs/{job}/tasks", json={"kind": "gc"})).json()
        assert (await wait_for_task(http, after["id"], DONE))["status"] == "succeeded"
        first = (await http.get(f"/v1/tasks/{queued['id']}")).json()
        assert (first["status"], first["attempts"]) == ("cancelled", 0)
        second = (await http.get(f"/v1/tasks/{running['id']}")).json()
        assert (second["status"], second["attempts"], second["result"]) == ("cancelled", 1, None)
        listed = (await http.get(f"/v1/jobs/{job}/tasks")).json()["tasks"]
        assert [t["id"] for t in listed] == [after["id"], running["id"], queued["id"]]


async def test_idempotency_keys_ownership_and_bad_input(stack: TaskStack) -> None:
    async with stack.client() as admin:
        job = await stack.create_job(admin)
        body = {"kind": "gc", "params": {"keep_last": 3}, "idempotency_key": "nightly-1"}
        first = await admin.post(f"/v1/jobs/{job}/tasks", json=body)
        again = await admin.post(f"/v1/jobs/{job}/tasks", json=body)
        assert (first.status_code, again.status_code) == (202, 200)
        assert again.json()["id"] == first.json()["id"]
        other = await admin.post(f"/v1/jobs/{job}/tasks", json={**body, "params": {}})
        assert other.status_code == 409 and first.json()["id"] in other.text

        bad = {
            "kind": {"kind": "train", "params": {}},
            "keep_last": {"kind": "gc", "params": {"keep_last": -1}},
            "items": {"kind": "evaluate", "params": {"verifier": "exact_match"}},
            "prompt": {
                "kind": "evaluate",
                "params": {"verifier": "math", "items": [{"prompt": ""}]},
            },
            "version": {"kind": "export", "params": {"version": "no such/alias"}},
            "unknown": {"kind": "gc", "params": {"unknown": 1}},
        }
        for field, request in bad.items():
            response = await admin.post(f"/v1/jobs/{job}/tasks", json=request)
            assert response.status_code == 422, (field, response.text)
            assert field in response.json()["error"]["message"], response.text
        missing = await admin.post("/v1/jobs/job_missing/tasks", json={"kind": "gc"})
        assert missing.status_code == 404 and "job_missing" in missing.text
        assert (await admin.get("/v1/tasks/task_missing")).status_code == 404

        alice = (await admin.post("/v1/keys", json={"name": "alice"})).json()["key"]
        bob = (await admin.post("/v1/keys", json={"name": "bob"})).json()["key"]
    async with stack.client(alice) as as_alice, stack.client(bob) as as_bob:
        own = await stack.create_job(as_alice)
        task = (await as_alice.post(f"/v1/jobs/{own}/tasks", json={"kind": "gc"})).json()
        assert (await as_alice.get(f"/v1/tasks/{task['id']}")).status_code == 200
        assert [t["id"] for t in (await as_alice.get("/v1/tasks")).json()["tasks"]] == [task["id"]]
        assert (await as_alice.get(f"/v1/tasks/{first.json()['id']}")).status_code == 404
        for request in (
            as_bob.get(f"/v1/tasks/{task['id']}"),
            as_bob.post(f"/v1/tasks/{task['id']}/cancel"),
            as_bob.get(f"/v1/jobs/{own}/tasks"),
            as_bob.post(f"/v1/jobs/{own}/tasks", json={"kind": "gc"}),
        ):
            assert (await request).status_code == 404
        assert (await as_bob.get("/v1/tasks")).json()["tasks"] == []


async def test_an_unreachable_broker_is_a_503_and_the_task_is_marked_failed(
    stack: TaskStack,
) -> None:
    settings = GatewaySettings(data_dir=stack.data_dir, database_url=stack.database_url)
    broker = WorkerSettings(
        data_dir=stack.data_dir, worker_broker_url=f"redis://127.0.0.1:{free_port()}/0"
    )
    async with stack.client() as http:
        job = await stack.create_job(http)  # the same database, another gateway below
    with serve_in_thread(create_app(settings, broker)) as url:
        async with stack.client() as http:
            http.base_url = httpx2.URL(url)
            response = await http.post(f"/v1/jobs/{job}/tasks", json={"kind": "gc"})
            assert response.status_code == 503, response.text
            error = response.json()["error"]
            assert "broker is unreachable" in error["message"]
            task = (await http.get(f"/v1/tasks/{error['detail']['task_id']}")).json()
            assert task["status"] == "failed" and task["error"]["code"] == "unavailable"
            assert (await http.post(f"/v1/tasks/{task['id']}/retry")).status_code == 503
            assert (await http.get(f"/v1/tasks/{task['id']}")).json()["status"] == "failed"


def test_the_sdk_submits_waits_and_raises_typed_errors(stack: TaskStack, tmp_path: Path) -> None:
    stack.worker().start()
    with LoomClient(stack.url, stack.admin_key) as loom:
        job = loom.create_job(str(stack.base_model))
        for step in (1, 2):
            asyncio.run(
                stack.publish(job.id, adapter_dir(tmp_path, f"v{step}", b"%d" % step), step)
            )
        task = job.submit_task("gc", GcParams(keep_last=1), idempotency_key="once")
        report = task.result(timeout=60)
        assert isinstance(report, GcReport) and report.versions_deleted == [f"{job.id}@1"]
        again = job.submit_task("gc", {"keep_last": 1}, idempotency_key="once")
        assert again.id == task.id and again.info.status == "succeeded"

        failing = job.submit_task(TaskKind.export, {"version": 7})
        with pytest.raises(NotFound, match="7"):
            failing.result(timeout=60)
        assert failing.info.status == "failed"
        assert [t.id for t in job.tasks()] == [failing.id, task.id]
        assert loom.get_task(task.id).info.result == report.model_dump(mode="json")
        with pytest.raises(ValidationError, match="keep_last"):
            job.submit_task("gc", {"keep_last": -1})


async def test_beat_runs_a_store_wide_gc_on_schedule(stack: TaskStack) -> None:
    stack.worker(LOOM_WORKER_GC_INTERVAL_S="1").start()
    async with stack.client() as admin:
        deadline = asyncio.get_running_loop().time() + 30
        while not (
            done := [
                t
                for t in (await admin.get("/v1/tasks")).json()["tasks"]
                if t["status"] == "succeeded"
            ]
        ):
            assert asyncio.get_running_loop().time() < deadline, "no scheduled gc ran"
            await asyncio.sleep(0.2)
        assert (done[0]["kind"], done[0]["job_id"]) == ("gc", None)
        assert set(done[0]["result"]) >= {"versions_deleted", "blobs_deleted", "bytes_freed"}
        alice = (await admin.post("/v1/keys", json={"name": "alice"})).json()["key"]
    async with stack.client(alice) as as_alice:  # store-wide tasks are for admins
        assert (await as_alice.get(f"/v1/tasks/{done[0]['id']}")).status_code == 404
        assert (await as_alice.get("/v1/tasks")).json()["tasks"] == []
