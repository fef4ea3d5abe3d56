"""Typed dependencies for the trainer's routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from services.trainer.service import TrainerService


def get_service(request: Request) -> TrainerService:
    service: TrainerService = request.app.state.trainer
    return service


ServiceDep = Annotated[TrainerService, Depends(get_service)]
