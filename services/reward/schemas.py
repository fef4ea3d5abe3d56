"""Wire models of the reward service."""

from __future__ import annotations

import ast
from typing import Any

from pydantic import Field, field_validator

from services.common.schemas import ErrorBody, LenientModel, StrictModel

MAX_ITEMS = 10_000  # per request, in one batch or across the batches of one


class ScoreItem(StrictModel):
    response: str = Field(max_length=1_000_000)
    reference: str | None = Field(default=None, max_length=1_000_000)


class ScoreRequest(StrictModel):
    verifier: str = Field(
        min_length=1,
        max_length=64,
        description="exact_match | first_integer | math | regex | countdown | code | python",
    )
    params: dict[str, Any] = Field(default={}, description="Verifier options, e.g. a pattern")
    items: list[ScoreItem] = Field(min_length=1, max_length=MAX_ITEMS)


class ScoreBatchRequest(StrictModel):
    """Several batches in one call (`POST /v1/score/batch`), e.g. every group of an RL step,
    each with its own verifier and params; a batch that cannot be scored (unknown verifier,
    bad params, a missing reference) gets an error of its own, the others their scores."""

    batches: list[ScoreRequest] = Field(min_length=1, max_length=MAX_ITEMS)

    @field_validator("batches")
    @classmethod
    def _bounded(cls, batches: list[ScoreRequest]) -> list[ScoreRequest]:
        total = sum(len(batch.items) for batch in batches)
        if total > MAX_ITEMS:
            raise ValueError(f"at most {MAX_ITEMS} items in all, got {total}")
        return batches


class ItemScore(LenientModel):
    reward: float
    error: str | None = None
    detail: dict[str, Any] = {}


class ScoreResponse(LenientModel):
    verifier: str
    scores: list[ItemScore]


class ScoreResult(LenientModel):
    """One batch of a `ScoreBatchRequest`: its scores, or (nothing scored) its error."""

    verifier: str
    scores: list[ItemScore] = []
    error: ErrorBody | None = None


class ScoreBatchResponse(LenientModel):
    results: list[ScoreResult] = Field(description="One per batch, in the request's order.")


class VerifierInfo(LenientModel):
    name: str
    description: str
    params: dict[str, str]


class VerifierList(LenientModel):
    verifiers: list[VerifierInfo]


def compiles(source: str, what: str) -> str:
    """`source` if it is valid Python, else a ValueError naming `what`."""
    try:
        ast.parse(source)
    except SyntaxError as exc:
        raise ValueError(f"{what} is not valid Python: {exc.msg} (line {exc.lineno})") from exc
    return source


def defines_reward(code: str, what: str) -> str:
    module = ast.parse(compiles(code, what))
    if not any(isinstance(node, ast.FunctionDef) and node.name == "reward" for node in module.body):
        raise ValueError(f"{what} must define a top-level function reward(response, reference)")
    return code


FUNCTION_NAME = r"^[a-z][a-z0-9_-]{0,63}$"
JOB_ID = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"


class RewardFunctionPut(StrictModel):
    code: str = Field(max_length=200_000, description="Defines reward(response, reference).")
    job_id: str | None = Field(
        default=None, pattern=JOB_ID, description="The job it belongs to; none: shared."
    )

    @field_validator("code")
    @classmethod
    def _defines_reward(cls, code: str) -> str:
        return defines_reward(code, "code")


class RewardFunction(LenientModel):
    name: str
    job_id: str | None
    code: str


class RewardFunctionList(LenientModel):
    functions: list[RewardFunction]
