"""The one place that picks the isolation backend; both are `AgentBackend`s (see agent_pool.py)."""

from __future__ import annotations

import logging

from services.sandbox.agent_pool import AgentBackend
from services.sandbox.settings import SandboxSettings

log = logging.getLogger(__name__)


def create_backend(settings: SandboxSettings) -> AgentBackend:
    from services.sandbox.docker_backend import DockerBackend, docker_available
    from services.sandbox.process_backend import ProcessBackend

    choice = settings.sandbox_backend
    if choice == "auto":
        why_not = docker_available(settings)
        choice = "process" if why_not else "docker"
        if why_not:
            log.info("sandbox backend: process (docker: %s)", why_not)
    return DockerBackend(settings) if choice == "docker" else ProcessBackend(settings)
