"""HTTP routes of the sandbox service: parse, call the backend, return."""

from __future__ import annotations

from fastapi import APIRouter

from services.sandbox.deps import BackendDep
from services.sandbox.schemas import ExecuteRequest, ExecuteResponse

router = APIRouter(prefix="/v1", tags=["sandbox"])


@router.post("/execute", response_model=ExecuteResponse)
async def execute(request: ExecuteRequest, backend: BackendDep) -> ExecuteResponse:
    """Run a program in a fresh sandbox and report how it ended, with its (bounded) output."""
    return await backend.execute(request)
