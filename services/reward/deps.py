"""Typed dependencies for the reward routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from services.reward.scoring import Scorer


def get_scorer(request: Request) -> Scorer:
    scorer: Scorer = request.app.state.scorer
    return scorer


ScorerDep = Annotated[Scorer, Depends(get_scorer)]
