"""The logprob reported with each sampled token is that of the distribution it was really drawn
from (after temperature and top-p/top-k), checked against the real engine's own sampling
frequencies: thousands of one-token draws, a chi-square test per setting. Raw logprobs (before
temperature and truncation, vLLM's default) fail it by orders of magnitude."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import httpx2
import pytest

from tests.integration.rollout.conftest import PROMPT

pytestmark = pytest.mark.integration
DRAWS_PER_REQUEST, REQUESTS = 256, 16


async def draws(
    client: httpx2.AsyncClient, params: dict[str, Any]
) -> tuple[Counter[int], dict[int, float]]:
    """Unseeded draws: independent ones, whatever vLLM's seeding of a request's n samples."""
    counts: Counter[int] = Counter()
    reported: dict[int, float] = {}
    for _ in range(REQUESTS):
        response = await client.post(
            "/v1/sample",
            json={
                "prompt_token_ids": PROMPT,
                "n": DRAWS_PER_REQUEST,
                "params": {"max_tokens": 1, **params},
            },
        )
        assert response.status_code == 200, response.text
        for drawn in response.json()["samples"]:
            token, logprob = drawn["token_ids"][0], drawn["logprobs"][0]
            counts[token] += 1
            # One distribution: a token is reported with the same logprob every time.
            assert reported.setdefault(token, logprob) == pytest.approx(logprob, abs=1e-4)
    return counts, reported


def chi_square(counts: Counter[int], reported: dict[int, float]) -> tuple[float, int]:
    """Over the drawn tokens expected at least 5 times; with the degrees of freedom."""
    total = sum(counts.values())
    bins = [
        (counts[t], total * math.exp(lp)) for t, lp in reported.items() if total * math.exp(lp) >= 5
    ]
    return sum((seen - want) ** 2 / want for seen, want in bins), len(bins) - 1


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 0.7, "top_p": 0.9},
        {"temperature": 0.7, "top_k": 8},
        {"temperature": 1.3, "top_p": 0.5},
    ],
    ids=["t0.7-top_p0.9", "t0.7-top_k8", "t1.3-top_p0.5"],
)
async def test_reported_logprobs_match_the_sampling_frequencies(
    rollout: httpx2.AsyncClient, params: dict[str, Any]
) -> None:
    counts, reported = await draws(rollout, params)
    mass = sum(math.exp(lp) for lp in reported.values())
    assert mass <= 1.0 + 1e-3  # a distribution over the tokens that can be drawn
    if "top_k" in params:  # all 8 were drawn: the whole support, so all of the mass
        assert len(reported) <= 8 and mass == pytest.approx(1.0, abs=1e-3)
    statistic, dof = chi_square(counts, reported)
    assert dof >= 3, (counts, reported)
    # p < 1e-6 under the hypothesis, a bound a right implementation passes essentially always
    assert statistic < dof + 7 * math.sqrt(2 * dof) + 20, (statistic, dof)
