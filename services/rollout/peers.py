"""The services agent loops call: the sandbox runs tools, the reward service scores episodes."""

from __future__ import annotations

from typing import Any

from services.common.http import ServiceClient
from services.reward.schemas import ScoreItem, ScoreRequest, ScoreResponse
from services.sandbox.schemas import ExecuteRequest, ExecuteResponse


class SandboxTools:
    """`services.rollout.environments.Tools` on the sandbox service."""

    def __init__(self, client: ServiceClient) -> None:
        self.client = client

    async def run_python(self, code: str, *, timeout_s: float) -> ExecuteResponse:
        request = ExecuteRequest(code=code, timeout_s=timeout_s)
        body = await self.client.post_json("/v1/execute", request.model_dump(mode="json"))
        return ExecuteResponse.model_validate(body)


class RewardScorer:
    def __init__(self, client: ServiceClient) -> None:
        self.client = client

    async def score(self, verifier: str, items: list[ScoreItem],
                    params: dict[str, Any]) -> ScoreResponse:
        request = ScoreRequest(verifier=verifier, items=items, params=params)
        body = await self.client.post_json("/v1/score", request.model_dump(mode="json"))
        return ScoreResponse.model_validate(body)
