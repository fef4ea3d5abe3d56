"""What the sandbox service needs from an isolation backend, and the one place that picks it."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from services.sandbox.schemas import ExecuteRequest, ExecuteResponse
from services.sandbox.settings import SandboxSettings


class Backend(Protocol):
    name: str

    async def start(self) -> None: ...

    async def execute(self, request: ExecuteRequest) -> ExecuteResponse: ...

    def describe(self) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...


log = logging.getLogger(__name__)


def create_backend(settings: SandboxSettings) -> Backend:
    from services.sandbox.docker_backend import DockerBackend, docker_available
    from services.sandbox.process_backend import ProcessBackend

    choice = settings.sandbox_backend
    if choice == "auto":
        why_not = docker_available(settings)
        choice = "process" if why_not else "docker"
        if why_not:
            log.info("sandbox backend: process (docker: %s)", why_not)
    return DockerBackend(settings) if choice == "docker" else ProcessBackend(settings)
