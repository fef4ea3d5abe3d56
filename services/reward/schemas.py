"""Wire models of the reward service."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.common.schemas import LenientModel, StrictModel


class ScoreItem(StrictModel):
    response: str = Field(max_length=1_000_000)
    reference: str | None = Field(default=None, max_length=1_000_000)


class ScoreRequest(StrictModel):
    verifier: str = Field(min_length=1, max_length=64,
                          description="exact_match | math | regex | code | python")
    params: dict[str, Any] = Field(default={}, description="Verifier options, e.g. a pattern")
    items: list[ScoreItem] = Field(min_length=1, max_length=10_000)


class ItemScore(LenientModel):
    reward: float
    error: str | None = None
    detail: dict[str, Any] = {}


class ScoreResponse(LenientModel):
    verifier: str
    scores: list[ItemScore]


class VerifierInfo(LenientModel):
    name: str
    description: str
    params: dict[str, str]


class VerifierList(LenientModel):
    verifiers: list[VerifierInfo]
