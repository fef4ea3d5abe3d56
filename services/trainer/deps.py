"""Typed dependencies for the trainer's routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header

from services.common.deps import app_state
from services.common.http import IDEMPOTENCY_KEY_HEADER
from services.trainer.service import TrainerService

ServiceDep = Annotated[TrainerService, Depends(app_state("trainer"))]
# A client-chosen key of one submission (at most 200 characters): the same key sent again, for
# the same model, is the same submission (see OperationQueue.submit).
IdempotencyKeyDep = Annotated[
    str | None, Header(alias=IDEMPOTENCY_KEY_HEADER, min_length=1, max_length=200)
]
