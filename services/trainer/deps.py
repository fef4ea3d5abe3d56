"""Typed dependencies for the trainer's routes."""

from __future__ import annotations

import hashlib
from typing import Annotated

from fastapi import Depends, Header, Request

from services.common.deps import app_state
from services.common.http import IDEMPOTENCY_KEY_HEADER
from services.trainer.service import Resubmittable, TrainerService

ServiceDep = Annotated[TrainerService, Depends(app_state("trainer"))]


async def resubmittable(
    request: Request,
    key: Annotated[
        str | None, Header(alias=IDEMPOTENCY_KEY_HEADER, min_length=1, max_length=200)
    ] = None,
) -> Resubmittable | None:
    """A client-chosen key of one submission (at most 200 characters): the same key sent again,
    for the same model and body, is the same submission (see OperationQueue.submit). The body
    is hashed as sent (already read to parse it): about 1 ms a MB, where serialising the parsed
    request again took 6-9 times that, on the event loop."""
    if key is None:
        return None
    return Resubmittable(key, hashlib.sha256(await request.body()).hexdigest())


IdempotencyKeyDep = Annotated[Resubmittable | None, Depends(resubmittable)]
