"""What the sandbox service needs from an isolation backend, and the one place that picks it.
The process backend runs here; a docker backend will implement the same protocol."""

from __future__ import annotations

from typing import Any, Protocol

from services.sandbox.schemas import ExecuteRequest, ExecuteResponse
from services.sandbox.settings import SandboxSettings


class Backend(Protocol):
    name: str

    async def start(self) -> None: ...

    async def execute(self, request: ExecuteRequest) -> ExecuteResponse: ...

    def describe(self) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...


def create_backend(settings: SandboxSettings) -> Backend:
    if settings.sandbox_backend == "process":
        from services.sandbox.process_backend import ProcessBackend

        return ProcessBackend(settings)
    raise ValueError(f"unknown sandbox backend {settings.sandbox_backend!r}")
