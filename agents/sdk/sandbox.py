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
        return await self._http.sandbox.execute_in_session(
            self.id, ExecuteRequest(code=code, **options)
        )

    async def write_files(self, files: Mapping[str, str | bytes]) -> None:
        """Write files (text or bytes) into the session's workdir."""
        items = [
            FileIn(path=path, content=data)
            if isinstance(data, str)
            else FileIn(path=path, content=base64.b64encode(data).decode(), encoding="base64")
            for path, data in files.items()
        ]
        await self._http.sandbox.write_files(self.id, items)

    async def read_files(self, paths: Sequence[str]) -> dict[str, bytes]:
        """The files' bytes; a file that cannot be returned raises with the reason."""
        read = await self._http.sandbox.read_files(self.id, list(paths))
        return {f.path: f.data() for f in read.files}

    async def close(self) -> None:
        await self._http.sandbox.close_session(self.id)

    async def __aenter__(self) -> AsyncSandboxSession:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncSandboxSession({self.id!r}, job={self.info.job_id!r})"
