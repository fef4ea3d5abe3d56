"""SDK logic: the public surface, futures polling, typed errors, the derived sync face.

The SDK against the real gateway and services is covered in tests/e2e."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import httpx
import pytest

import agents.sdk as sdk
from agents.sdk import AsyncLoomClient, InvalidInput, LoomClient, NotFound

NOW = datetime.now(UTC).isoformat()


def test_public_surface_is_pinned() -> None:
    assert sorted(sdk.__all__) == sorted([
        "AdamParams", "AsyncJob", "AsyncLoomClient", "AsyncSandboxSession", "Conflict", "Datum",
        "Forbidden", "Future", "InvalidInput", "Job", "LimitExceeded", "LoomClient", "LoomError",
        "LoraConfig", "LossConfig", "NotFound", "OperationFuture", "SampleResponse",
        "SamplingParams", "SandboxSession", "ScoreItem", "TrainingMode", "Unauthorized",
        "Unavailable", "UpstreamError", "Version",
    ])


def _job(job_id: str = "job_1") -> dict:
    return {"id": job_id, "name": "t", "base_model": "loom/tiny", "mode": "lora", "lora": None,
            "config": {}, "status": "running", "created_at": NOW}


def _operation(status: str, **extra: object) -> dict:
    return {"id": "op_1", "kind": "optim_step", "status": status, "created_at": NOW, **extra}


class FakeGateway:
    """Answers like the gateway: an operation that finishes on the second poll."""

    def __init__(self) -> None:
        self.polls = 0
        self.auth: set[str] = set()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.auth.add(request.headers["authorization"])
        path = request.url.path
        if path == "/v1/jobs/job_1":
            return httpx.Response(200, json=_job())
        if path == "/v1/jobs/missing":
            return httpx.Response(404, json={"error": {"code": "not_found",
                                                       "message": "No job 'missing'"}})
        if path == "/v1/trainer/models/job_1/optim_step":
            assert json.loads(request.content)["adam"]["lr"] == 0.01
            return httpx.Response(202, json=_operation("pending"))
        if path == "/v1/trainer/operations/op_1":
            self.polls += 1
            if self.polls < 2:
                return httpx.Response(200, json=_operation("running"))
            return httpx.Response(200, json=_operation(
                "succeeded", result={"step": 1, "grad_norm": 0.5, "lr": 0.01}))
        return httpx.Response(404, json={"error": {"code": "not_found", "message": path}})


async def test_futures_poll_until_done_and_parse_the_result() -> None:
    gateway = FakeGateway()
    async with AsyncLoomClient("http://gw", "k1", transport=httpx.MockTransport(gateway)) as loom:
        job = await loom.get_job("job_1")
        future = await job.optim_step(sdk.AdamParams(lr=0.01))
        result = await future
    assert result.step == 1 and result.grad_norm == 0.5
    assert gateway.polls == 2
    assert gateway.auth == {"Bearer k1"}


async def test_error_envelopes_become_typed_exceptions() -> None:
    transport = httpx.MockTransport(FakeGateway())
    async with AsyncLoomClient("http://gw", "k", transport=transport) as loom:
        with pytest.raises(NotFound, match="No job 'missing'"):
            await loom.get_job("missing")


async def test_a_failed_operation_raises_its_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/optim_step"):
            return httpx.Response(202, json=_operation("pending"))
        if request.url.path == "/v1/jobs/job_1":
            return httpx.Response(200, json=_job())
        return httpx.Response(200, json=_operation("failed", error={
            "code": "invalid_input", "message": "token id 999 >= vocab 271"}))

    async with AsyncLoomClient("http://gw", "k", transport=httpx.MockTransport(handler)) as loom:
        job = await loom.get_job("job_1")
        with pytest.raises(InvalidInput, match="vocab"):
            await (await job.optim_step())


def test_sync_face_blocks_and_wraps_jobs_and_futures() -> None:
    with LoomClient("http://gw", "k", transport=httpx.MockTransport(FakeGateway())) as loom:
        job = loom.get_job("job_1")
        assert isinstance(job, sdk.Job) and job.id == "job_1"
        future = job.optim_step(sdk.AdamParams(lr=0.01))
        assert isinstance(future, sdk.Future)
        assert future.result().step == 1
        with pytest.raises(NotFound):
            loom.get_job("missing")
