"""The reward service's typed client: one method per route."""

from __future__ import annotations

from typing import Any

from services.common.http import Route, ServiceClient
from services.reward.schemas import (
    RewardFunction,
    RewardFunctionList,
    RewardFunctionPut,
    ScoreBatchRequest,
    ScoreBatchResponse,
    ScoreRequest,
    ScoreResponse,
    VerifierList,
)

SCORE = Route("POST", "/v1/score", ScoreResponse, ScoreRequest)
SCORE_BATCH = Route("POST", "/v1/score/batch", ScoreBatchResponse, ScoreBatchRequest)
VERIFIERS = Route("GET", "/v1/verifiers", VerifierList)
PUT_FUNCTION = Route("PUT", "/v1/functions/{name}", RewardFunction, RewardFunctionPut)
LIST_FUNCTIONS = Route("GET", "/v1/functions", RewardFunctionList)
GET_FUNCTION = Route("GET", "/v1/functions/{name}", RewardFunction)
DELETE_FUNCTION: Route[None] = Route("DELETE", "/v1/functions/{name}", None)


def _job(job_id: str | None) -> dict[str, Any]:
    return {} if job_id is None else {"job_id": job_id}


class RewardClient(ServiceClient):
    SERVICE = "reward"

    async def score(self, request: ScoreRequest) -> ScoreResponse:
        """One batch scored by one verifier; a failing item gets reward 0 and its error."""
        return await self.call(SCORE, request)

    async def score_batch(self, request: ScoreBatchRequest) -> ScoreBatchResponse:
        """Several batches in one call, each with its own verifier and its own error."""
        return await self.call(SCORE_BATCH, request)

    async def verifiers(self) -> VerifierList:
        return await self.call(VERIFIERS)

    async def put_function(self, name: str, request: RewardFunctionPut) -> RewardFunction:
        return await self.call(PUT_FUNCTION, request, name=name)

    async def list_functions(self, job_id: str | None = None) -> RewardFunctionList:
        return await self.call(LIST_FUNCTIONS, params=_job(job_id))

    async def get_function(self, name: str, job_id: str | None = None) -> RewardFunction:
        return await self.call(GET_FUNCTION, params=_job(job_id), name=name)

    async def delete_function(self, name: str, job_id: str | None = None) -> None:
        await self.call(DELETE_FUNCTION, params=_job(job_id), name=name)
