"""HTTP routes of the reward service: parse, call the scorer, return."""

from __future__ import annotations

from fastapi import APIRouter

from services.reward.deps import ScorerDep
from services.reward.schemas import ScoreRequest, ScoreResponse, VerifierList
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
