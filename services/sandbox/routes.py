"""HTTP routes of the sandbox service: parse, call the backend or the sessions, return."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from services.sandbox.deps import BackendDep, SessionsDep
from services.sandbox.schemas import (
    MAX_FILES,
    ExecuteRequest,
    ExecuteResponse,
    FilesRead,
    FilesWrite,
    SessionCreate,
    SessionInfo,
    WorkdirPath,
)

router = APIRouter(prefix="/v1", tags=["sandbox"])


@router.post("/execute", response_model=ExecuteResponse)
async def execute(request: ExecuteRequest, backend: BackendDep) -> ExecuteResponse:
    """Run a program in a fresh sandbox and report how it ended, with its (bounded) output."""
    return await backend.execute(request)


@router.post("/sessions", response_model=SessionInfo, status_code=201)
async def create_session(body: SessionCreate, sessions: SessionsDep) -> SessionInfo:
    """A sandbox whose workdir keeps its files between programs (multi-turn tools)."""
    return await sessions.create(body.job_id, body.image)


@router.get("/sessions/{session_id}", response_model=SessionInfo)
async def get_session(session_id: str, sessions: SessionsDep) -> SessionInfo:
    return sessions.get(session_id)


@router.post("/sessions/{session_id}/execute", response_model=ExecuteResponse)
async def execute_in_session(
    session_id: str, request: ExecuteRequest, sessions: SessionsDep
) -> ExecuteResponse:
    """Run a program in the session's sandbox; its files stay, its processes do not."""
    return await sessions.execute(session_id, request)


@router.put("/sessions/{session_id}/files", status_code=204)
async def write_files(session_id: str, body: FilesWrite, sessions: SessionsDep) -> Response:
    await sessions.write_files(session_id, body.files)
    return Response(status_code=204)


@router.get("/sessions/{session_id}/files", response_model=FilesRead)
async def read_files(
    session_id: str,
    sessions: SessionsDep,
    path: Annotated[list[WorkdirPath], Query(max_length=MAX_FILES)],
) -> FilesRead:
    """Files of the session's workdir (base64), e.g. `?path=out.txt&path=data/x.csv`."""
    return FilesRead(files=await sessions.read_files(session_id, path))


@router.delete("/sessions/{session_id}", status_code=204)
async def close_session(session_id: str, sessions: SessionsDep) -> Response:
    await sessions.close(session_id)
    return Response(status_code=204)
