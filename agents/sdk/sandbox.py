"""Sandbox sessions in the SDK: a sandbox whose files persist between programs, for tools that
keep state across turns. Closed by `close()` or by leaving an `async with` block."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

from agents.sdk._http import GatewayHttp
from services.sandbox.schemas import (
    ExecuteRequest,
    ExecuteResponse,
    FileIn,
    FilesRead,
    FilesWrite,
    SessionInfo,
)


class AsyncSandboxSession:
    info: SessionInfo

    def __init__(self, http: GatewayHttp, info: SessionInfo) -> None:
        self._http = http
        self.info = info

    @property
    def id(self) -> str:
        return self.info.id

    async def execute(self, code: str, **options: Any) -> ExecuteResponse:
        """Run a program (same options as `AsyncLoomClient.execute`); files stay, processes
        do not."""
        request = ExecuteRequest(code=code, **options)
        body = await self._http.post_json(f"{self._path}/execute",
                                          request.model_dump(mode="json"))
        return ExecuteResponse.model_validate(body)

    async def write_files(self, files: Mapping[str, str | bytes]) -> None:
        """Write files (text or bytes) into the session's workdir."""
        items = [FileIn(path=path, content=data) if isinstance(data, str)
                 else FileIn(path=path, content=base64.b64encode(data).decode(),
                             encoding="base64")
                 for path, data in files.items()]
        await self._http.request("PUT", f"{self._path}/files",
                                 json=FilesWrite(files=items).model_dump(mode="json"))

    async def read_files(self, paths: Sequence[str]) -> dict[str, bytes]:
        """The files' bytes; a file that cannot be returned raises with the reason."""
        response = await self._http.request("GET", f"{self._path}/files",
                                            params=[("path", p) for p in paths])
        return {f.path: f.data() for f in FilesRead.model_validate(response.json()).files}

    async def close(self) -> None:
        await self._http.request("DELETE", self._path)

    async def __aenter__(self) -> AsyncSandboxSession:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    @property
    def _path(self) -> str:
        return f"/v1/sandbox/sessions/{self.id}"

    def __repr__(self) -> str:
        return f"AsyncSandboxSession({self.id!r}, job={self.info.job_id!r})"
