"""`POST /v1/score/batch` on the real reward app (lifespan run, worker pool real), and the
rollout service's scorer, which gathers the groups that finish together into one such call."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

from services.common.errors import InvalidInput
from services.common.service_token import service_headers
from services.reward.client import RewardClient
from services.reward.schemas import MAX_ITEMS, ScoreItem
from services.reward.settings import RewardSettings
from services.rollout.peers import RewardScorer
from tests.support.reward import reward_app

SETTINGS = RewardSettings(reward_workers=1, reward_item_timeout_s=3.0)


@pytest.fixture(scope="module")
async def transport() -> AsyncIterator[httpx2.ASGITransport]:
    async with reward_app(SETTINGS) as app:
        yield httpx2.ASGITransport(app=app)


@pytest.fixture
async def client(transport: httpx2.ASGITransport) -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(
        transport=transport, base_url="http://reward", timeout=60, headers=service_headers(SETTINGS)
    ) as c:
        yield c


def batch(
    verifier: str, pairs: list[tuple[str, str | None]], params: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "verifier": verifier,
        "params": params or {},
        "items": [{"response": r, "reference": g} for r, g in pairs],
    }


async def batch_requests(client: httpx2.AsyncClient) -> float:
    """How many /v1/score/batch requests the service has answered (its own /metrics)."""
    for line in (await client.get("/metrics")).text.splitlines():
        if line.startswith("loom_http_requests_total") and '"/v1/score/batch"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_each_batch_is_scored_with_its_own_verifier_and_errors_stay_in_theirs(
    client: httpx2.AsyncClient,
) -> None:
    body = {
        "batches": [
            batch("first_integer", [("57 and more", "57"), ("-3", "3"), ("1,234", "1234")]),
            batch("exact_match", [("57 and more", "57"), (" 57 ", "57")]),
            batch("nope", [("x", None)]),
            batch("regex", [("abc42", None), ("abc", None)], {"pattern": r"\d+"}),
            batch("math", [("1/2", None)]),  # no reference: this batch alone is refused
            batch("first_integer", [("7", "seven")]),  # a bad item: its own error
            batch("regex", [("x", None)], {"pattern": float("nan")}),
        ]
    }
    response = await client.post(
        "/v1/score/batch",
        content=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["verifier"] for r in results] == [
        "first_integer",
        "exact_match",
        "nope",
        "regex",
        "math",
        "first_integer",
        "regex",
    ]
    assert [s["reward"] for s in results[0]["scores"]] == [1.0, 0.0, 1.0]
    assert [s["reward"] for s in results[1]["scores"]] == [0.0, 1.0]
    assert results[2]["error"]["code"] == "invalid_input" and not results[2]["scores"]
    assert "known verifiers" in results[2]["error"]["message"]
    assert [s["reward"] for s in results[3]["scores"]] == [1.0, 0.0]
    assert results[3]["scores"][0]["detail"] == {"match": "42"}
    assert "needs a reference" in results[4]["error"]["message"]
    assert results[5]["error"] is None
    assert results[5]["scores"][0]["reward"] == 0.0
    assert "holds no integer" in results[5]["scores"][0]["error"]
    assert "nan" in str(results[6]["error"]["detail"]).lower()  # spelled, not a 500


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"batches": []}, "batches"),
        ({}, "batches"),
        ({"batches": [{"verifier": "exact_match"}]}, "items"),
        ({"batches": [batch("exact_match", [("1", "1")])], "extra": 1}, "extra"),
        (
            {
                "batches": [batch("regex", [("x", None)] * (MAX_ITEMS // 2 + 1), {"pattern": "x"})]
                * 2
            },
            f"at most {MAX_ITEMS} items in all",
        ),
    ],
)
async def test_a_malformed_batch_request_is_a_422(
    client: httpx2.AsyncClient, body: dict[str, Any], message: str
) -> None:
    response = await client.post("/v1/score/batch", json=body)
    assert response.status_code == 422, response.text
    assert message in response.json()["error"]["message"]


async def test_the_single_batch_form_still_scores(client: httpx2.AsyncClient) -> None:
    response = await client.post("/v1/score", json=batch("first_integer", [("x=12", "12")]))
    assert response.status_code == 200 and response.json()["scores"][0]["reward"] == 1.0


async def test_groups_that_finish_together_share_one_request(
    client: httpx2.AsyncClient, transport: httpx2.ASGITransport
) -> None:
    """16 groups asking at once (a step's) cost one request; each gets its own scores, and a
    group that cannot be scored gets its error while the others are scored."""
    service = RewardClient("http://reward", transport=transport, headers=service_headers(SETTINGS))
    scorer = RewardScorer(service)
    before = await batch_requests(client)
    groups = [
        [ScoreItem(response=f"{g + i}", reference=str(g)) for i in range(8)] for g in range(16)
    ]
    calls = [scorer.score("first_integer", items, {}) for items in groups]
    calls.append(scorer.score("math", [ScoreItem(response="1")], {}))  # no reference
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert await batch_requests(client) - before == 1
    for response in results[:16]:
        assert not isinstance(response, BaseException)
        assert [s.reward for s in response.scores] == [1.0] + [0.0] * 7
    assert isinstance(results[16], InvalidInput) and "needs a reference" in str(results[16])
    # Later calls make a request of their own.
    again = await scorer.score("exact_match", [ScoreItem(response="1", reference="1")], {})
    assert again.scores[0].reward == 1.0 and await batch_requests(client) - before == 2
