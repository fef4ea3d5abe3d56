"""The code and python verifiers: the reward service scoring through a real sandbox service."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import pytest

from services.reward.settings import RewardSettings
from services.sandbox.app import create_app as create_sandbox_app
from tests.support.reward import reward_client, score_items
from tests.support.sandboxes import sandbox_settings
from tests.support.servers import serve_in_thread

TESTS = """
import math
def near(a, b):
    return math.isclose(a, b)
assert add(1, 2) == 3
assert add(-1, 1) == 0
assert near(add(0.1, 0.2), 0.3)
assert add(10, 5) == 15
"""


@pytest.fixture(scope="module")
def sandbox_url() -> Iterator[str]:
    with serve_in_thread(create_sandbox_app(sandbox_settings("process"))) as url:
        yield url


@pytest.fixture(scope="module")
def settings(sandbox_url: str, tmp_path_factory: pytest.TempPathFactory) -> RewardSettings:
    return RewardSettings(
        reward_workers=1,
        reward_item_timeout_s=8.0,
        sandbox_url=sandbox_url,
        data_dir=tmp_path_factory.mktemp("reward"),
    )


@pytest.fixture(scope="module")
async def client(settings: RewardSettings) -> AsyncIterator[httpx2.AsyncClient]:
    async with reward_client(settings) as c:
        yield c


async def test_code_reward_is_the_fraction_of_tests_passed(client: httpx2.AsyncClient) -> None:
    candidates = [
        "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\n",  # all pass
        "def add(a, b):\n    return int(a + b)\n",  # fails the float test only
        "def add(a, b):\n    return a - b\n",  # passes add(-1, 1) == 0 only... and no other
        "def add(a, b) return a + b",  # syntax error
        "import os\nos._exit(0)\n",  # exits before any assertion
        "def add(a, b):\n    while True:\n        pass\n",  # hangs: every test times out
    ]
    scores = await score_items(
        client,
        {
            "verifier": "code",
            "params": {"timeout_s": 1},
            "items": [{"response": c, "reference": TESTS} for c in candidates],
        },
    )
    rewards = [s["reward"] for s in scores]
    assert rewards == [1.0, 0.75, 0.0, 0.0, 0.0, 0.0]
    assert scores[1]["detail"]["passed"] == 3 and scores[1]["detail"]["total"] == 4
    assert "SyntaxError" in scores[3]["detail"]["error"]
    assert {t["status"] for t in scores[5]["detail"]["tests"]} == {"timeout"}
    assert all(s["error"] is None for s in scores)


async def test_code_tests_can_come_from_params(client: httpx2.AsyncClient) -> None:
    scores = await score_items(
        client,
        {
            "verifier": "code",
            "params": {"tests": TESTS},
            "items": [{"response": "add = lambda a, b: a + b"}],
        },
    )
    assert scores[0]["reward"] == 1.0


async def test_a_jobs_reward_function_runs_per_item(client: httpx2.AsyncClient) -> None:
    code = """
def reward(response, reference):
    if response == "hang":
        while True:
            pass
    if response == "crash":
        raise ValueError("no")
    return float(response.strip() == reference), {"length": len(response)}
"""
    items = [
        {"response": "42", "reference": "42"},
        {"response": "41", "reference": "42"},
        {"response": "crash", "reference": "x"},
        {"response": "hang", "reference": "x"},
    ]
    scores = await score_items(
        client, {"verifier": "python", "params": {"code": code, "timeout_s": 1}, "items": items}
    )
    assert [s["reward"] for s in scores] == [1.0, 0.0, 0.0, 0.0]
    assert scores[0]["detail"] == {"length": 2} and scores[0]["error"] is None
    assert "ValueError: no" in scores[2]["error"]
    assert "timeout" in scores[3]["error"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"verifier": "code", "items": [{"response": "x"}]}, "needs a reference"),
        (
            {"verifier": "code", "params": {"tests": "x = 1"}, "items": [{"response": "x"}]},
            "no top-level assert",
        ),
        (
            {"verifier": "code", "params": {"tests": "assert ("}, "items": [{"response": "x"}]},
            "not valid Python",
        ),
        (
            {
                "verifier": "python",
                "params": {"code": "def f(): pass"},
                "items": [{"response": "x"}],
            },
            "reward(response",
        ),
        (
            {"verifier": "python", "params": {}, "items": [{"response": "x"}]},
            "exactly one of params.code and params.function",
        ),
    ],
)
async def test_bad_code_verifier_requests_get_422(
    client: httpx2.AsyncClient, body: dict[str, Any], message: str
) -> None:
    response = await client.post("/v1/score", json=body)
    assert response.status_code == 422
    assert message in response.text


async def test_registered_functions_score_and_survive_a_restart(
    client: httpx2.AsyncClient, settings: RewardSettings
) -> None:
    code = "def reward(response, reference):\n    return len(response) / 10\n"
    put = await client.put("/v1/functions/length", json={"code": code, "job_id": "job-1"})
    assert put.status_code == 200 and put.json()["job_id"] == "job-1"
    listed = await client.get("/v1/functions", params={"job_id": "job-1"})
    assert [f["name"] for f in listed.json()["functions"]] == ["length"]
    assert (await client.get("/v1/functions")).json()["functions"] == []  # not shared

    body = {
        "verifier": "python",
        "params": {"function": "length", "job_id": "job-1"},
        "items": [{"response": "abcde"}],
    }
    assert [s["reward"] for s in await score_items(client, body)] == [0.5]
    async with reward_client(settings) as restarted:
        assert [s["reward"] for s in await score_items(restarted, body)] == [0.5]

    other_job = await client.post(
        "/v1/score", json={**body, "params": {"function": "length", "job_id": "job-2"}}
    )
    assert other_job.status_code == 404 and "job job-2" in other_job.text
    assert (
        await client.delete("/v1/functions/length", params={"job_id": "job-1"})
    ).status_code == 204
    assert (await client.post("/v1/score", json=body)).status_code == 404


@pytest.mark.parametrize(
    ("name", "body", "status"),
    [
        ("ok_name", {"code": "def f(): pass"}, 422),
        ("ok_name", {"code": "def reward(r, g) return 1"}, 422),
        ("Bad Name", {"code": "def reward(r, g): return 1"}, 422),
        ("ok_name", {"code": "def reward(r, g): return 1", "job_id": "../x"}, 422),
    ],
)
async def test_bad_registrations_get_422(
    client: httpx2.AsyncClient, name: str, body: dict[str, Any], status: int
) -> None:
    response = await client.put(f"/v1/functions/{name}", json=body)
    assert response.status_code == status, response.text
