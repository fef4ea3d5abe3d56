"""Typed dependencies for the trainer's routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from services.common.deps import app_state
from services.trainer.service import TrainerService

ServiceDep = Annotated[TrainerService, Depends(app_state("trainer"))]
