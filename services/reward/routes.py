"""HTTP routes of the reward service: parse, call the scorer, return."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from services.reward.deps import FunctionsDep, ScorerDep
from services.reward.schemas import (
    FUNCTION_NAME,
    JOB_ID,
    RewardFunction,
    RewardFunctionList,
    RewardFunctionPut,
    ScoreRequest,
    ScoreResponse,
    VerifierList,
)
from services.reward.verifiers import verifier_list

router = APIRouter(prefix="/v1", tags=["reward"])


@router.post("/score", response_model=ScoreResponse)
async def score(request: ScoreRequest, scorer: ScorerDep) -> ScoreResponse:
    """Score a batch with one verifier. A failing item gets reward 0 and an error."""
    return await scorer.score(request)


@router.get("/verifiers", response_model=VerifierList)
async def verifiers() -> VerifierList:
    """The verifiers this service knows, with their parameters."""
    return verifier_list()


FunctionName = Annotated[str, Path(pattern=FUNCTION_NAME)]
JobQuery = Annotated[str | None, Query(pattern=JOB_ID)]


@router.put("/functions/{name}", response_model=RewardFunction)
async def put_function(name: FunctionName, body: RewardFunctionPut,
                       functions: FunctionsDep) -> RewardFunction:
    """Register (or replace) a reward function; score with verifier `python` and
    params {"function": name, "job_id": ...}. It runs in the sandbox, never here."""
    return functions.put(name, body.job_id, body.code)


@router.get("/functions", response_model=RewardFunctionList)
async def list_functions(functions: FunctionsDep, job_id: JobQuery = None) -> RewardFunctionList:
    return RewardFunctionList(functions=functions.list(job_id))


@router.get("/functions/{name}", response_model=RewardFunction)
async def get_function(name: FunctionName, functions: FunctionsDep,
                       job_id: JobQuery = None) -> RewardFunction:
    return functions.get(name, job_id)


@router.delete("/functions/{name}", status_code=204)
async def delete_function(name: FunctionName, functions: FunctionsDep,
                          job_id: JobQuery = None) -> Response:
    functions.delete(name, job_id)
    return Response(status_code=204)
