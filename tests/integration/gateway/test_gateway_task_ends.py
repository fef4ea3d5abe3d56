"""The internal routes the worker calls for the gateway's rows (`GatewayCalls`): they want the
service token (an API key, even the admin's, is not one), and each does its work once however
often it is sent: a run key replaces the job's earlier one, an end recorded again moves
nothing again."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx2
import pytest

from services.common.db import make_engine, make_sessionmaker, transaction
from services.common.errors import NotFound
from services.common.schemas import MetricPoint
from services.common.service_token import service_headers
from services.worker.gateway_calls import GatewayCalls
from services.worker.models import BackgroundTaskRow
from services.worker.task_schemas import TaskEnd, TaskStatus

if TYPE_CHECKING:
    from tests.integration.gateway.conftest import Stack


async def test_the_workers_routes_want_the_token_and_do_their_work_once(stack: Stack) -> None:
    async with stack.client() as admin:
        job_id = (await admin.post("/v1/jobs", json={"base_model": "loom/tiny"})).json()["id"]
        for path in (f"/v1/internal/jobs/{job_id}/run-key", "/v1/internal/tasks/task_x/end"):
            assert (await admin.put(path, json={})).status_code == 401  # a key, not the token
    gateway = GatewayCalls(stack.url, headers=service_headers(stack.settings))
    try:
        first = await gateway.renew_run_key(job_id)
        second = await gateway.renew_run_key(job_id)  # as if the first answer was lost
        for key, status in ((first, 401), (second, 200)):
            async with stack.client(key) as run:
                assert (await run.get(f"/v1/jobs/{job_id}")).status_code == status
        await gateway.drop_run_key(job_id)
        await gateway.drop_run_key(job_id)
        async with stack.client(second) as run:
            assert (await run.get(f"/v1/jobs/{job_id}")).status_code == 401
        with pytest.raises(NotFound):
            await gateway.renew_run_key("job_missing")

        engine = make_engine(stack.settings.database_url_for("gateway"))
        with transaction(make_sessionmaker(engine)) as session:  # a run, its attempt 1 going
            session.add(
                BackgroundTaskRow(
                    id="task_run",
                    job_id=job_id,
                    kind="recipe",
                    params={},
                    status="running",
                    attempts=1,
                )
            )
        engine.dispose()
        end = TaskEnd(
            attempt=1,
            status=TaskStatus.succeeded,
            result={"steps": 3},
            metrics=[MetricPoint(step=3, name="eval/x/accuracy", value=0.5)],
        )
        assert await gateway.end_task("task_run", end)
        assert await gateway.end_task("task_run", end)  # sent again: the same answer
        assert not await gateway.end_task(
            "task_run", end.model_copy(update={"status": TaskStatus.failed})
        )
    finally:
        await gateway.aclose()
    async with stack.client() as admin:
        assert (await admin.get(f"/v1/jobs/{job_id}")).json()["status"] == "completed"
        task = (await admin.get("/v1/tasks/task_run")).json()
        assert (task["status"], task["result"]) == ("succeeded", {"steps": 3})
        series = (await admin.get(f"/v1/jobs/{job_id}/metrics")).json()["series"]
        assert [(s["name"], s["steps"], s["values"]) for s in series] == [
            ("eval/x/accuracy", [3], [0.5])
        ]


async def test_the_workers_routes_refuse_bad_input_with_a_4xx_and_change_nothing(
    stack: Stack,
) -> None:
    """Malformed, oversized, unknown and path-probing requests, with the service token."""
    async with stack.client() as admin:
        job = (await admin.post("/v1/jobs", json={"base_model": "loom/tiny"})).json()
        job_id = job["id"]
    token = service_headers(stack.settings)
    async with httpx2.AsyncClient(base_url=stack.url, headers=token, timeout=30) as worker:
        for path in (
            "/v1/internal/jobs/..%2F..%2Fkeys/run-key",
            "/v1/internal/jobs/%2e%2e/run-key",
            f"/v1/internal/jobs/{'j' * 5000}/run-key",
            "/v1/internal/tasks/..%2Fx/end",
        ):
            answer = await worker.put(path, json={"attempt": 1, "status": "succeeded"})
            assert 400 <= answer.status_code < 500, (path, answer.status_code)
        end = "/v1/internal/tasks/task_missing/end"
        assert (await worker.put(end, content=b"{not json")).status_code == 422
        assert (await worker.put(end, json={"attempt": "one"})).status_code == 422
        # An end of a task it does not have records nothing: the worker takes it as a claim
        # lost (as for a task another worker took over).
        unknown = await worker.put(end, json={"attempt": 1, "status": "succeeded"})
        assert (unknown.status_code, unknown.json()) == (200, {"ended": False})
    async with stack.client() as admin:
        assert (await admin.get(f"/v1/jobs/{job_id}")).json()["status"] == job["status"]
        assert (await admin.get("/v1/tasks/task_missing")).status_code == 404
