"""SDK logic: the public surface, futures polling, typed errors, the derived sync face.

The SDK against the real gateway and services is covered in tests/e2e."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import httpx2
import pytest

import agents.sdk as sdk
from agents.sdk import AsyncLoomClient, InvalidInput, LoomClient, NotFound

NOW = datetime.now(UTC).isoformat()


def test_public_surface_is_pinned() -> None:
    assert sorted(sdk.__all__) == sorted(
        [
            "AdamParams",
            "AsyncCaptureSession",
            "AsyncJobClient",
            "AsyncLoomClient",
            "AsyncPipeline",
            "AsyncRolloutStream",
            "AsyncSandboxSession",
            "AsyncTask",
            "BackgroundTask",
            "BadRequest",
            "CaptureSession",
            "CapturedSegment",
            "CapturedTrajectory",
            "ChatMessage",
            "Conflict",
            "Datum",
            "Forbidden",
            "Future",
            "InvalidInput",
            "JobClient",
            "LimitExceeded",
            "LoomClient",
            "LoomError",
            "LoraConfig",
            "LossConfig",
            "NotFound",
            "OperationFuture",
            "Pipeline",
            "RolloutGroup",
            "RolloutStream",
            "RolloutTask",
            "SampleResponse",
            "SamplingParams",
            "SandboxSession",
            "ScoreItem",
            "ScoreRequest",
            "StepResult",
            "Task",
            "Trajectory",
            "TrainingMode",
            "Unauthorized",
            "Unavailable",
            "UpstreamError",
            "Version",
        ]
    )
    assert [name for name in sdk.__all__ if not hasattr(sdk, name)] == []


def _job(job_id: str = "job_1") -> dict:
    return {
        "id": job_id,
        "name": "t",
        "base_model": "loom/tiny",
        "mode": "lora",
        "lora": None,
        "config": {},
        "status": "running",
        "created_at": NOW,
    }


def _operation(status: str, **extra: object) -> dict:
    return {"id": "op_1", "kind": "optim_step", "status": status, "created_at": NOW, **extra}


class FakeGateway:
    """Answers like the gateway: an operation that finishes on the second poll."""

    def __init__(self) -> None:
        self.polls = 0
        self.auth: set[str] = set()

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.auth.add(request.headers["authorization"])
        path = request.url.path
        if path == "/v1/jobs/job_1":
            return httpx2.Response(200, json=_job())
        if path == "/v1/jobs/missing":
            return httpx2.Response(
                404, json={"error": {"code": "not_found", "message": "No job 'missing'"}}
            )
        if path == "/v1/trainer/models/job_1/optim_step":
            assert json.loads(request.content)["adam"]["lr"] == 0.01
            return httpx2.Response(202, json=_operation("pending"))
        if path == "/v1/trainer/operations/op_1":
            self.polls += 1
            if self.polls < 2:
                return httpx2.Response(200, json=_operation("running"))
            return httpx2.Response(
                200, json=_operation("succeeded", result={"step": 1, "grad_norm": 0.5, "lr": 0.01})
            )
        return httpx2.Response(404, json={"error": {"code": "not_found", "message": path}})


async def test_futures_poll_until_done_and_parse_the_result() -> None:
    gateway = FakeGateway()
    async with AsyncLoomClient("http://gw", "k1", transport=httpx2.MockTransport(gateway)) as loom:
        job = await loom.get_job("job_1")
        future = await job.optim_step(sdk.AdamParams(lr=0.01))
        result = await future
    assert result.step == 1 and result.grad_norm == 0.5
    assert gateway.polls == 2
    assert gateway.auth == {"Bearer k1"}


async def test_error_envelopes_become_typed_exceptions() -> None:
    transport = httpx2.MockTransport(FakeGateway())
    async with AsyncLoomClient("http://gw", "k", transport=transport) as loom:
        with pytest.raises(NotFound, match="No job 'missing'"):
            await loom.get_job("missing")


async def test_a_failed_operation_raises_its_error() -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/optim_step"):
            return httpx2.Response(202, json=_operation("pending"))
        if request.url.path == "/v1/jobs/job_1":
            return httpx2.Response(200, json=_job())
        return httpx2.Response(
            200,
            json=_operation(
                "failed", error={"code": "invalid_input", "message": "token id 999 >= vocab 271"}
            ),
        )

    async with AsyncLoomClient("http://gw", "k", transport=httpx2.MockTransport(handler)) as loom:
        job = await loom.get_job("job_1")
        with pytest.raises(InvalidInput, match="vocab"):
            await (await job.optim_step())


def test_sync_face_blocks_and_wraps_jobs_and_futures() -> None:
    with LoomClient("http://gw", "k", transport=httpx2.MockTransport(FakeGateway())) as loom:
        job = loom.get_job("job_1")
        assert isinstance(job, sdk.JobClient) and job.id == "job_1"
        future = job.optim_step(sdk.AdamParams(lr=0.01))
        assert isinstance(future, sdk.Future)
        assert future.result().step == 1
        with pytest.raises(NotFound):
            loom.get_job("missing")


def _rollout_gateway(request: httpx2.Request) -> httpx2.Response:
    body = json.loads(request.content)
    if body["env"] == "chess":
        return httpx2.Response(
            422, json={"error": {"code": "invalid_input", "message": "Unknown environment 'chess'"}}
        )
    trajectory = {
        "task_index": 0,
        "sample_index": 0,
        "prompt_token_ids": [1],
        "token_ids": [2, 3],
        "logprobs": [-0.1, -0.2],
        "loss_mask": [1, 1],
        "turns": [],
        "stop_reason": "done",
        "response": "5",
        "reward": 1.0,
    }
    lines = [
        {"type": "group", "group": {"task_index": 0, "trajectories": [trajectory]}},
        {
            "type": "error",
            "error": {
                "code": "unavailable",
                "message": "sandbox down",
                "detail": {"task_index": 1},
            },
        },
        {
            "type": "summary",
            "summary": {
                "groups": 1,
                "trajectories": 1,
                "model_tokens": 2,
                "env_tokens": 0,
                "wall_s": 0.5,
            },
        },
    ]
    assert request.url.path == "/v1/rollout/rollouts" and body["job_id"] == "job_1"
    return httpx2.Response(
        200,
        content="".join(json.dumps(x) + "\n" for x in lines),
        headers={"content-type": "application/x-ndjson"},
    )


def _rollouts_transport() -> httpx2.MockTransport:
    def handler(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/v1/jobs/job_1":
            return httpx2.Response(200, json=_job())
        return _rollout_gateway(request)

    return httpx2.MockTransport(handler)


async def test_rollout_stream_yields_groups_and_keeps_errors_and_summary() -> None:
    async with AsyncLoomClient("http://gw", "k", transport=_rollouts_transport()) as loom:
        job = await loom.get_job("job_1")
        stream = await job.rollouts([{"prompt": "2+3=", "reference": "5"}] * 2, env="arithmetic")
        groups = await stream.collect()
        with pytest.raises(InvalidInput, match="Unknown environment 'chess'"):
            await job.rollouts([{"prompt": "x"}], env="chess")
    assert [g.rewards for g in groups] == [[1.0]]
    assert [e.detail for e in stream.errors] == [{"task_index": 1}]
    assert stream.summary is not None and stream.summary.model_tokens == 2


def test_rollout_stream_sync_face_iterates() -> None:
    with LoomClient("http://gw", "k", transport=_rollouts_transport()) as loom:
        job = loom.get_job("job_1")
        stream = job.rollouts([{"prompt": "2+3=", "reference": "5"}], env="arithmetic")
        groups = list(stream)
        assert groups[0].trajectories[0].response == "5"
        assert stream.summary.groups == 1


async def test_sample_many_sends_one_request_per_batch_on_the_version_the_first_resolved() -> None:
    """Every prompt in one `POST /v1/rollout/sample/batch` (up to MAX_BATCH_PROMPTS each): the
    first resolves `latest`, later ones ask for that number and start from a seed of their
    own (the service derives prompt i's seed from its index in its request)."""
    from services.rollout.schemas import MAX_BATCH_PROMPTS

    sent: list[dict] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/v1/jobs/job_1":
            return httpx2.Response(200, json=_job())
        assert request.url.path == "/v1/rollout/sample/batch"
        body = json.loads(request.content)
        sent.append(body)
        sample = {"token_ids": [1], "logprobs": [-0.5], "text": "x", "stop_reason": "length"}
        responses = [
            {
                "job_id": "job_1",
                "version": 7,
                "prompt_token_ids": prompt if isinstance(prompt, list) else [2],
                "samples": [{**sample, "version": 7}] * body["n"],
            }
            for prompt in body["prompts"]
        ]
        return httpx2.Response(200, json={"job_id": "job_1", "version": 7, "responses": responses})

    prompts: list[str | list[int]] = ["1+1="] * MAX_BATCH_PROMPTS + [[3, 4]]
    params = sdk.SamplingParams(max_tokens=2, seed=11)
    async with AsyncLoomClient("http://gw", "k", transport=httpx2.MockTransport(handler)) as loom:
        job = await loom.get_job("job_1")
        responses = await job.sample_many(prompts, n=2, params=params)
    assert len(responses) == len(prompts) and responses[-1].prompt_token_ids == [3, 4]
    assert [(len(b["prompts"]), b["version"], b["n"]) for b in sent] == [
        (MAX_BATCH_PROMPTS, "latest", 2),
        (1, 7, 2),
    ]
    assert [b["params"]["seed"] for b in sent] == [11, params.derived(1).seed]

    # Long samples: each request stays within the service's token budget, so none is refused.
    from services.rollout.schemas import MAX_BATCH_SAMPLE_TOKENS, SampleBatchRequest

    sent.clear()
    long = sdk.SamplingParams(max_tokens=32768)
    async with AsyncLoomClient("http://gw", "k", transport=httpx2.MockTransport(handler)) as loom:
        job = await loom.get_job("job_1")
        responses = await job.sample_many(["1+1="] * 300, n=16, params=long)
    assert len(responses) == 300
    assert [len(b["prompts"]) for b in sent] == [16] * 18 + [12]
    for body in sent:
        SampleBatchRequest.model_validate(body)  # what the service checks
        assert len(body["prompts"]) * 16 * 32768 <= MAX_BATCH_SAMPLE_TOKENS
