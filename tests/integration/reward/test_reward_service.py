"""The reward service through its app, with the lifespan run so the worker pool is real."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

from services.reward.settings import RewardSettings
from tests.support.reward import reward_client, score_items

CATASTROPHIC = "(a|aa)+$"  # exponential backtracking on "aaa...ab" (in the regex engine too)


@pytest.fixture(scope="module")
async def client() -> AsyncIterator[httpx2.AsyncClient]:
    async with reward_client(RewardSettings(reward_workers=2, reward_item_timeout_s=3.0)) as c:
        yield c


async def test_verifiers_are_listed(client: httpx2.AsyncClient) -> None:
    response = await client.get("/v1/verifiers")
    assert response.status_code == 200
    names = [v["name"] for v in response.json()["verifiers"]]
    assert names == ["exact_match", "first_integer", "math", "regex", "countdown", "code", "python"]


async def test_math_batch(client: httpx2.AsyncClient) -> None:
    pairs = [
        ("1/2", "0.5"),
        ("\\frac{1}{2}", "0.5"),
        ("x=3", "3"),
        ("\\boxed{4}", "3"),
        ("no answer at all", "3"),
    ]
    scores = await score_items(
        client, {"verifier": "math", "items": [{"response": r, "reference": g} for r, g in pairs]}
    )
    assert [s["reward"] for s in scores] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert all(s["error"] is None for s in scores)


async def test_exact_match_batch_with_params(client: httpx2.AsyncClient) -> None:
    body = {
        "verifier": "exact_match",
        "params": {"case_sensitive": False},
        "items": [
            {"response": " YES ", "reference": "yes"},
            {"response": "no", "reference": "yes"},
        ],
    }
    scores = await score_items(client, body)
    assert [s["reward"] for s in scores] == [1.0, 0.0]


async def test_a_failing_item_does_not_fail_the_batch(client: httpx2.AsyncClient) -> None:
    scores = await score_items(
        client,
        {
            "verifier": "math",
            "items": [
                {"response": "2", "reference": "2"},
                {"response": "2", "reference": "not a number"},
                {"response": "\\frac{4}{2}", "reference": "2"},
            ],
        },
    )
    assert [s["reward"] for s in scores] == [1.0, 0.0, 1.0]
    assert scores[1]["error"] and "no mathematical answer" in scores[1]["error"]


async def test_a_hanging_item_times_out_alone(client: httpx2.AsyncClient) -> None:
    scores = await score_items(
        client,
        {
            "verifier": "regex",
            "params": {"pattern": CATASTROPHIC},
            "items": [{"response": "a" * 60 + "b"}, {"response": "aaaa"}, {"response": "bbb"}],
        },
    )
    assert scores[0]["reward"] == 0.0 and "timed out" in scores[0]["error"]
    assert [s["reward"] for s in scores[1:]] == [1.0, 0.0]
    # the service keeps working (its threads were freed at the deadline)
    later = await score_items(
        client, {"verifier": "math", "items": [{"response": "0.25", "reference": "1/4"}]}
    )
    assert later[0]["reward"] == 1.0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"verifier": "nope", "items": [{"response": "x"}]},
            "known verifiers: code, countdown, exact_match",
        ),
        (
            {"verifier": "regex", "params": {"pattern": "[a-"}, "items": [{"response": "x"}]},
            "invalid regular expression",
        ),
        ({"verifier": "math", "items": [{"response": "1"}]}, "needs a reference"),
        ({"verifier": "math", "items": []}, "items"),
        ({"verifier": "math"}, "items"),
        ({"verifier": "math", "items": [{"response": 3, "reference": "3"}]}, "response"),
        ({"verifier": "math", "items": [{"response": "3"}], "extra": 1}, "extra"),
    ],
)
async def test_bad_requests_get_a_clear_422(
    client: httpx2.AsyncClient, body: dict[str, Any], message: str
) -> None:
    response = await client.post("/v1/score", json=body)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_input" and message in error["message"]


async def test_a_rejected_non_finite_number_is_a_422_that_spells_it(
    client: httpx2.AsyncClient,
) -> None:
    """Python's JSON reads NaN and Infinity; an error that echoes them must still render."""
    response = await client.post(
        "/v1/score",
        content=(
            b'{"verifier": "regex", "params": {"pattern": NaN, "flags": -Infinity}, '
            b'"items": [{"response": "x"}]}'
        ),
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 422, response.text
    assert "nan" in response.text.lower()
