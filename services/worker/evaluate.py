"""Evaluation of one version of a job on a held-out set: one completion per item sampled
through rollout (greedy by default), scored by a reward verifier, summarised as accuracy and
mean reward, and recorded as job metrics at the version's step."""

from __future__ import annotations

import asyncio

from modelstate.client import ModelStateClient
from services.common.schemas import MetricPoint
from services.reward.client import RewardClient
from services.reward.schemas import ScoreItem, ScoreRequest
from services.rollout.client import RolloutClient
from services.rollout.schemas import SampleRequest
from services.worker.schemas import EvaluateParams, EvaluateResult

CONCURRENT_SAMPLES = 16  # enough to keep the engine's batch full without flooding it


async def evaluate(
    modelstate: ModelStateClient,
    rollout: RolloutClient,
    reward: RewardClient,
    job_id: str,
    params: EvaluateParams,
) -> EvaluateResult:
    number, step = await _resolve(modelstate, job_id, params)
    limit = asyncio.Semaphore(CONCURRENT_SAMPLES)

    async def complete(prompt: str) -> str:
        request = SampleRequest(
            job_id=job_id, version=number, prompt=prompt, params=params.sampling
        )
        async with limit:
            return (await rollout.sample(request)).samples[0].text

    texts = await asyncio.gather(*(complete(item.prompt) for item in params.items))
    request = ScoreRequest(
        verifier=params.verifier,
        params=params.verifier_params,
        items=[
            ScoreItem(response=text, reference=item.reference)
            for text, item in zip(texts, params.items, strict=True)
        ],
    )
    scores = (await reward.score(request)).scores
    rewards = [score.reward for score in scores]
    correct = sum(r >= params.pass_threshold for r in rewards)
    prefix = f"eval/{params.name}"
    return EvaluateResult(
        name=params.name,
        version=number,
        step=step,
        count=len(rewards),
        correct=correct,
        errors=sum(score.error is not None for score in scores),
        accuracy=correct / len(rewards),
        mean_reward=sum(rewards) / len(rewards),
        metrics=[f"{prefix}/accuracy", f"{prefix}/mean_reward"],
    )


def metric_points(result: EvaluateResult) -> list[MetricPoint]:
    """The result as job metrics: `eval/<name>/accuracy` and `.../mean_reward` at its step."""
    values = {"accuracy": result.accuracy, "mean_reward": result.mean_reward}
    return [
        MetricPoint(step=result.step, name=f"eval/{result.name}/{key}", value=value)
        for key, value in values.items()
    ]


async def _resolve(
    modelstate: ModelStateClient, job_id: str, params: EvaluateParams
) -> tuple[int, int]:
    """The version's number (an alias is resolved once, so every item uses the same one)
    and the step its metrics go to: its training step, else its number; 0 for the base."""
    if params.version == 0:
        return 0, 0
    version = await modelstate.get_version(job_id, params.version)
    return version.number, version.step if version.step is not None else version.number
