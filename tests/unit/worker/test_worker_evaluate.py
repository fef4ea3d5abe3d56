"""The evaluation task's logic against small stand-ins for modelstate, rollout and reward
(httpx2 mock transports speaking the services' real schemas): what is sampled, how it is
scored and summarised, which metrics it records, and how service errors come back."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx2
import pytest

from modelstate.client import ModelStateClient
from modelstate.schemas import Version, VersionKind
from services.common.errors import InvalidInput, Unavailable, UpstreamError
from services.reward.client import RewardClient
from services.reward.schemas import ItemScore, ScoreRequest, ScoreResponse
from services.rollout.client import RolloutClient
from services.rollout.schemas import Sample, SampleRequest, SampleResponse
from services.worker.evaluate import evaluate, metric_points
from services.worker.schemas import EvaluateParams

ANSWERS = {"1+1=": "2", "2+2=": "4", "3+3=": "7", "4+4=": "8"}  # the model gets 3+3 wrong


class Doubles:
    def __init__(self, step: int | None = 40, reward_status: int = 200) -> None:
        self.step = step
        self.reward_status = reward_status
        self.samples: list[SampleRequest] = []
        self.scored: list[ScoreRequest] = []

    def modelstate(self, request: httpx2.Request) -> httpx2.Response:
        assert request.url.path == "/v1/jobs/job_1/versions/best"
        version = Version(
            id=9,
            job_id="job_1",
            number=5,
            parent=4,
            step=self.step,
            kind=VersionKind.lora,
            base_model="loom/tiny",
            files=[],
            metrics={},
            aliases=["best"],
            created_at=datetime.now(UTC),
        )
        return httpx2.Response(200, json=version.model_dump(mode="json"))

    def rollout(self, request: httpx2.Request) -> httpx2.Response:
        assert request.url.path == "/v1/sample"
        sample = SampleRequest.model_validate(json.loads(request.content))
        self.samples.append(sample)
        text = ANSWERS[sample.prompt or ""]
        body = SampleResponse(
            job_id=sample.job_id,
            version=5,
            prompt_token_ids=[1],
            samples=[
                Sample(token_ids=[2], logprobs=[-0.1], text=text, stop_reason="stop", version=5)
            ],
        )
        return httpx2.Response(200, json=body.model_dump(mode="json"))

    def reward(self, request: httpx2.Request) -> httpx2.Response:
        if self.reward_status != 200:
            return httpx2.Response(
                self.reward_status,
                json={
                    "error": {
                        "code": "invalid_input",
                        "message": "Unknown verifier 'nope'",
                        "detail": None,
                    }
                },
            )
        score = ScoreRequest.model_validate(json.loads(request.content))
        self.scored.append(score)
        scores = [
            ItemScore(
                reward=float(item.response == item.reference),
                error=None if item.reference else "no reference",
            )
            for item in score.items
        ]
        return httpx2.Response(
            200, json=ScoreResponse(verifier=score.verifier, scores=scores).model_dump()
        )

    async def run(self, params: EvaluateParams) -> Any:
        modelstate = ModelStateClient("http://ms", transport=httpx2.MockTransport(self.modelstate))
        rollout = RolloutClient("http://ro", transport=httpx2.MockTransport(self.rollout))
        reward = RewardClient("http://rw", transport=httpx2.MockTransport(self.reward))
        try:
            return await evaluate(modelstate, rollout, reward, "job_1", params)
        finally:
            for client in (modelstate, rollout, reward):
                await client.aclose()


def params(**fields: Any) -> EvaluateParams:
    items = [
        {"prompt": p, "reference": a}
        for p, a in (("1+1=", "2"), ("2+2=", "4"), ("3+3=", "6"), ("4+4=", None))
    ]
    return EvaluateParams.model_validate(
        {"name": "arith", "version": "best", "verifier": "exact_match", "items": items, **fields}
    )


async def test_samples_greedily_at_one_version_scores_and_summarises() -> None:
    doubles = Doubles()
    result = await doubles.run(params(verifier_params={"strip": True}))
    assert (result.version, result.step, result.count) == (5, 40, 4)
    assert (result.correct, result.errors) == (2, 1)
    assert (result.accuracy, result.mean_reward) == (0.5, 0.5)
    assert result.metrics == ["eval/arith/accuracy", "eval/arith/mean_reward"]
    # The alias was resolved once: every item sampled the same number, greedily, in order.
    assert {(s.job_id, s.version, s.n, s.params.temperature) for s in doubles.samples} == {
        ("job_1", 5, 1, 0.0)
    }
    [score] = doubles.scored
    assert (score.verifier, score.params) == ("exact_match", {"strip": True})
    assert [i.response for i in score.items] == ["2", "4", "7", "8"]
    assert [(p.step, p.name, p.value) for p in metric_points(result)] == [
        (40, "eval/arith/accuracy", 0.5),
        (40, "eval/arith/mean_reward", 0.5),
    ]


async def test_thresholds_and_the_step_of_a_version_without_one() -> None:
    result = await Doubles(step=None).run(params(pass_threshold=0.0))
    assert (result.step, result.correct, result.accuracy) == (5, 4, 1.0)


async def test_the_base_model_is_version_zero_at_step_zero() -> None:
    doubles = Doubles()
    result = await doubles.run(params(version=0))
    assert (result.version, result.step) == (0, 0)
    assert {s.version for s in doubles.samples} == {0}


@pytest.mark.parametrize(("status", "error"), [(422, InvalidInput), (500, UpstreamError)])
async def test_service_errors_keep_their_fault(status: int, error: type[Exception]) -> None:
    with pytest.raises(error, match="Unknown verifier"):
        await Doubles(reward_status=status).run(params())


async def test_an_unreachable_service_is_an_outage() -> None:
    modelstate = ModelStateClient("http://127.0.0.1:9")  # nothing listens on the discard port
    rollout = RolloutClient("http://127.0.0.1:9", retries=0)
    reward = RewardClient("http://127.0.0.1:9", retries=0)
    try:
        with pytest.raises(Unavailable, match="rollout is unreachable"):
            await evaluate(modelstate, rollout, reward, "job_1", params(version=0))
    finally:
        for client in (modelstate, rollout, reward):
            await client.aclose()
