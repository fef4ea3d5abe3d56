"""Sandbox backends for tests: settings per backend and the requirement each one has."""

from __future__ import annotations

import uuid
from typing import Any

import docker
from docker.models.containers import Container

from services.sandbox.docker_backend import POOL_LABEL, docker_available
from services.sandbox.settings import SandboxSettings
from tests.conftest import require

BACKENDS = ("process", "docker")


def sandbox_settings(backend: str, **overrides: Any) -> SandboxSettings:
    """Settings for `backend`; skips (fails in CI) when docker cannot run here. Each docker
    backend gets a pool label of its own, so tests never touch each other's containers."""
    settings = SandboxSettings(
        sandbox_backend=backend,
        sandbox_docker_pool=f"loom-test-{uuid.uuid4().hex[:8]}",
        **overrides,
    )
    if backend == "docker":
        why_not = docker_available(settings)
        require(why_not is None, f"the docker sandbox backend ({why_not})")
    return settings


def docker_pool(settings: SandboxSettings) -> list[Container]:
    """The containers labelled with `settings`' docker pool, whatever their state."""
    client = docker.DockerClient(base_url=settings.sandbox_docker_url)
    try:
        label = f"{POOL_LABEL}={settings.sandbox_docker_pool}"
        return list(client.containers.list(all=True, filters={"label": label}))
    finally:
        client.close()
