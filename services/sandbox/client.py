"""The sandbox service's typed client: one method per route."""

from __future__ import annotations

from services.common.http import Route, ServiceClient
from services.sandbox.schemas import (
    ExecuteRequest,
    ExecuteResponse,
    FileIn,
    FilesRead,
    FilesWrite,
    SessionCreate,
    SessionInfo,
)

EXECUTE = Route("POST", "/v1/execute", ExecuteResponse, ExecuteRequest)
CREATE_SESSION = Route("POST", "/v1/sessions", SessionInfo, SessionCreate)
GET_SESSION = Route("GET", "/v1/sessions/{session_id}", SessionInfo)
EXECUTE_IN_SESSION = Route(
    "POST", "/v1/sessions/{session_id}/execute", ExecuteResponse, ExecuteRequest
)
WRITE_FILES: Route[None] = Route("PUT", "/v1/sessions/{session_id}/files", None, FilesWrite)
READ_FILES = Route("GET", "/v1/sessions/{session_id}/files", FilesRead)
CLOSE_SESSION: Route[None] = Route("DELETE", "/v1/sessions/{session_id}", None)


class SandboxClient(ServiceClient):
    SERVICE = "sandbox"

    async def execute(self, request: ExecuteRequest) -> ExecuteResponse:
        """A program in a fresh sandbox: how it ended, with its (bounded) output."""
        return await self.call(EXECUTE, request)

    async def create_session(self, request: SessionCreate) -> SessionInfo:
        return await self.call(CREATE_SESSION, request)

    async def get_session(self, session_id: str) -> SessionInfo:
        return await self.call(GET_SESSION, session_id=session_id)

    async def execute_in_session(self, session_id: str, request: ExecuteRequest) -> ExecuteResponse:
        return await self.call(EXECUTE_IN_SESSION, request, session_id=session_id)

    async def write_files(self, session_id: str, files: list[FileIn]) -> None:
        await self.call(WRITE_FILES, FilesWrite(files=files), session_id=session_id)

    async def read_files(self, session_id: str, paths: list[str]) -> FilesRead:
        return await self.call(READ_FILES, params={"path": paths}, session_id=session_id)

    async def close_session(self, session_id: str) -> None:
        await self.call(CLOSE_SESSION, session_id=session_id)
