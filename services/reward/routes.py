"""HTTP routes of the reward service: parse, call the scorer, return."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response
from pydantic import BaseModel

from services.reward.deps import FunctionsDep, ScorerDep
from services.reward.schemas import (
    FUNCTION_NAME,
    JOB_ID,
    RewardFunction,
    RewardFunctionList,
    RewardFunctionPut,
    ScoreBatchRequest,
    ScoreBatchResponse,
    ScoreRequest,
    ScoreResponse,
    VerifierList,
)
from services.reward.verifiers import verifier_list

router = APIRouter(prefix="/v1", tags=["reward"])


def _json(body: BaseModel) -> Response:
    """Encoded once, by pydantic: a model returned as such FastAPI would dump to a dict,
    validate again against the response model and encode (most of a batch's time)."""
    return Response(body.model_dump_json(), media_type="application/json")


@router.post("/score", response_model=ScoreResponse)
async def score(request: ScoreRequest, scorer: ScorerDep) -> Response:
    """Score a batch with one verifier. A failing item gets reward 0 and an error."""
    return _json(await scorer.score(request))


@router.post("/score/batch", response_model=ScoreBatchResponse)
async def score_batches(request: ScoreBatchRequest, scorer: ScorerDep) -> Response:
    """Score several batches in one call (e.g. every group of a step), each with its own
    verifier and params. A batch that cannot be scored gets an error; the others their scores."""
    return _json(await scorer.score_batches(request))


@router.get("/verifiers", response_model=VerifierList)
async def verifiers() -> VerifierList:
    """The verifiers this service knows, with their parameters."""
    return verifier_list()


FunctionName = Annotated[str, Path(pattern=FUNCTION_NAME)]
JobQuery = Annotated[str | None, Query(pattern=JOB_ID)]


@router.put("/functions/{name}", response_model=RewardFunction)
async def put_function(
    name: FunctionName, body: RewardFunctionPut, functions: FunctionsDep
) -> RewardFunction:
    """Register (or replace) a reward function; score with verifier `python` and
    params {"function": name, "job_id": ...}. It runs in the sandbox, never here."""
    return functions.put(name, body.job_id, body.code)


@router.get("/functions", response_model=RewardFunctionList)
async def list_functions(functions: FunctionsDep, job_id: JobQuery = None) -> RewardFunctionList:
    return RewardFunctionList(functions=functions.list(job_id))


@router.get("/functions/{name}", response_model=RewardFunction)
async def get_function(
    name: FunctionName, functions: FunctionsDep, job_id: JobQuery = None
) -> RewardFunction:
    return functions.get(name, job_id)


@router.delete("/functions/{name}", status_code=204)
async def delete_function(
    name: FunctionName, functions: FunctionsDep, job_id: JobQuery = None
) -> Response:
    functions.delete(name, job_id)
    return Response(status_code=204)
