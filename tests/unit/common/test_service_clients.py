"""The service kit's client mechanism: typed routes, the gateway prefix, retries (only where a
repeat is safe), unreachable services as one typed error, idempotent operation submissions."""

from __future__ import annotations

import asyncio

import httpx2
import pytest

from modelstate.client import ARCHIVE, ModelStateClient
from services.common.errors import Conflict, NotFound, Unavailable, UpstreamError
from services.common.http import IDEMPOTENCY_KEY_HEADER, Route, ServiceClient
from services.common.operations import OperationQueue
from services.common.schemas import Operation
from services.reward.client import RewardClient
from services.reward.schemas import ScoreItem, ScoreRequest, ScoreResponse
from services.trainer.client import TrainerClient, operation_result
from services.trainer.schemas import OptimStepRequest

SCORED = {"verifier": "exact", "scores": [{"reward": 1.0}]}


def recording(
    answers: list[httpx2.Response | Exception],
) -> tuple[httpx2.MockTransport, list[httpx2.Request]]:
    """A transport answering with `answers` in turn (an exception is raised), recording each
    request."""
    seen: list[httpx2.Request] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        answer = answers[min(len(seen), len(answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return httpx2.MockTransport(handle), seen


async def test_a_typed_call_sends_the_schema_and_validates_the_answer() -> None:
    transport, seen = recording([httpx2.Response(200, json=SCORED)])
    client = RewardClient("http://reward", transport=transport)
    request = ScoreRequest(verifier="exact", items=[ScoreItem(response="1", reference="1")])
    scored = await client.score(request)
    assert isinstance(scored, ScoreResponse) and scored.scores[0].reward == 1.0
    assert (seen[0].method, seen[0].url.path) == ("POST", "/v1/score")
    with pytest.raises(TypeError, match="ScoreRequest"):
        await client.call(Route("POST", "/v1/score", ScoreResponse, ScoreRequest))


async def test_through_the_gateway_a_route_takes_the_service_prefix() -> None:
    transport, seen = recording([httpx2.Response(204)])
    client = RewardClient(
        "http://gateway",
        transport=transport,
        through_gateway=True,
        headers={"Authorization": "Bearer key"},
    )
    await client.delete_function("a/b", job_id="job-1")
    assert seen[0].url.raw_path == b"/v1/reward/functions/a%2Fb?job_id=job-1"
    assert seen[0].headers["Authorization"] == "Bearer key"


async def test_only_a_repeatable_request_is_retried() -> None:
    busy = httpx2.Response(503, json={"error": {"code": "unavailable", "message": "busy"}})
    transport, seen = recording([busy, httpx2.Response(200, json=SCORED)])
    client = ServiceClient("http://reward", service="reward", transport=transport)
    with pytest.raises(UpstreamError, match="busy"):
        await client.post_json("/v1/score", {})  # a POST without a key: sent once
    assert len(seen) == 1
    seen.clear()
    await client.post_json("/v1/score", {}, headers={IDEMPOTENCY_KEY_HEADER: "k"})
    await client.get_json("/v1/verifiers")
    assert [request.method for request in seen] == ["POST", "POST", "GET"]


async def test_a_call_without_an_answer_is_one_typed_error() -> None:
    transport, seen = recording([httpx2.ConnectError("refused")])
    client = ServiceClient("http://reward", service="reward", transport=transport, retries=2)
    with pytest.raises(Unavailable, match="reward is unreachable"):
        await client.get_json("/v1/verifiers")
    assert len(seen) == 3
    transport, seen = recording([httpx2.ReadError("reset")])  # connected: it may have acted
    client = ServiceClient("http://reward", service="reward", transport=transport, retries=0)
    with pytest.raises(UpstreamError, match="reward failed to answer") as caught:
        await client.post_json("/v1/score", {})
    assert caught.value.detail == {"service": "reward"}


async def test_a_typed_client_shares_a_pool_and_opens_streams() -> None:
    transport, seen = recording(
        [
            httpx2.Response(200, content=b"tar bytes"),
            httpx2.Response(404, json={"error": {"code": "not_found", "message": "no version 9"}}),
        ]
    )
    pool = httpx2.AsyncClient(base_url="http://modelstate", transport=transport)
    client = ModelStateClient(pool, timeout=httpx2.Timeout(1.0), retries=0)
    archive = await client.open(ARCHIVE, job_id="a b", ref=1)
    assert await archive.aread() == b"tar bytes"
    await archive.aclose()
    assert seen[0].url.raw_path == b"/v1/jobs/a%20b/versions/1/archive"
    assert seen[0].extensions["timeout"]["read"] == 1.0
    with pytest.raises(NotFound, match="no version 9"):
        await client.open(ARCHIVE, job_id="a", ref=9)
    assert not pool.is_closed
    await pool.aclose()


async def test_trainer_submissions_carry_an_idempotency_key_and_polling_waits() -> None:
    pending = {
        "id": "op_1",
        "kind": "optim_step",
        "status": "pending",
        "created_at": "2025-01-01T00:00:00Z",
    }
    done = {**pending, "status": "succeeded", "result": {"step": 1}}
    transport, seen = recording(
        [
            httpx2.Response(202, json=pending),
            httpx2.Response(200, json=pending),
            httpx2.Response(200, json=done),
        ]
    )
    client = TrainerClient("http://trainer", transport=transport)
    assert await client.run("optim_step", "job-1", OptimStepRequest()) == {"step": 1}
    assert seen[0].headers[IDEMPOTENCY_KEY_HEADER]
    assert [r.url.path for r in seen] == [
        "/v1/models/job-1/optim_step",
        "/v1/operations/op_1",
        "/v1/operations/op_1",
    ]
    failed = Operation.model_validate(
        {**pending, "status": "failed", "error": {"code": "conflict", "message": "No gradients"}}
    )
    with pytest.raises(Conflict, match="No gradients"):
        operation_result(failed)


async def test_an_operation_submitted_again_under_its_key_runs_once() -> None:
    queue = OperationQueue()
    runs: list[str] = []
    first = queue.submit(
        "model", "step", lambda: runs.append("a"), idempotency_key="k", fingerprint="same"
    )
    again = queue.submit(
        "model", "step", lambda: runs.append("b"), idempotency_key="k", fingerprint="same"
    )
    other_model = queue.submit("other", "step", lambda: runs.append("c"), idempotency_key="k")
    assert again.id == first.id and other_model.id != first.id
    with pytest.raises(Conflict, match="another request"):
        queue.submit("model", "step", lambda: None, idempotency_key="k", fingerprint="changed")
    await queue.wait(first.id, timeout=5)
    await queue.wait(other_model.id, timeout=5)
    assert sorted(runs) == ["a", "c"]
    assert (
        queue.submit("model", "step", lambda: None, idempotency_key="k", fingerprint="same").id
        == first.id
    )  # still answered once done
    queue.shutdown()
    await asyncio.sleep(0)
