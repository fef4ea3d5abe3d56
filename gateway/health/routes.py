"""The stack's health as the gateway sees it (`GET /v1/health`). Routes parse, call, return."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gateway.auth.deps import CurrentKey
from gateway.health import health
from gateway.schemas import StackHealth

router = APIRouter(prefix="/v1")


@router.get("/health", response_model=StackHealth, tags=["ops"])
async def stack_health(request: Request, _key: CurrentKey) -> StackHealth:
    return await health.stack_health(request.app.state, request.app.version)
