"""Typed dependencies for the reward routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from services.common.deps import app_state
from services.reward.functions import FunctionStore
from services.reward.scoring import Scorer

ScorerDep = Annotated[Scorer, Depends(app_state("scorer"))]
FunctionsDep = Annotated[FunctionStore, Depends(app_state("functions"))]
