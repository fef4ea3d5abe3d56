"""The sandbox service: isolated execution of untrusted code."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from services.common.app_factory import create_service_app
from services.common.service_token import service_token
from services.sandbox.backend import create_backend
from services.sandbox.routes import router
from services.sandbox.sessions import SessionManager
from services.sandbox.settings import SandboxSettings


def create_app(settings: SandboxSettings | None = None) -> FastAPI:
    settings = settings or SandboxSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        backend = create_backend(settings)
        await backend.start()
        sessions = SessionManager(backend, settings)
        sessions.start()
        app.state.backend, app.state.sessions = backend, sessions
        try:
            yield
        finally:
            await sessions.aclose()
            await backend.aclose()

    async def readiness() -> dict[str, Any]:
        return dict(app.state.backend.describe())

    app = create_service_app(
        "sandbox",
        routers=[router],
        lifespan=lifespan,
        readiness=readiness,
        service_token=service_token(settings),
    )
    app.state.settings = settings
    return app
