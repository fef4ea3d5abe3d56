"""The model-state service: `create_app(settings)` builds the store at start-up."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from modelstate import events, routes
from modelstate.blobstore import BlobStore
from modelstate.events import VersionBroadcaster
from modelstate.settings import ModelStateSettings
from modelstate.store import ModelStore
from services.common.app_factory import create_service_app
from services.common.db import make_engine, make_sessionmaker, migrate

ALEMBIC_DIR = Path(__file__).parent / "alembic"
VERSION_TABLE = "alembic_version_modelstate"


def create_app(settings: ModelStateSettings | None = None) -> FastAPI:
    settings = settings or ModelStateSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = settings.database_url_for("modelstate")
        await run_in_threadpool(migrate, url, ALEMBIC_DIR, VERSION_TABLE)
        engine = make_engine(url)
        blobs = BlobStore(settings.modelstate_blob_dir, settings.modelstate_max_file_bytes)
        app.state.settings = settings
        app.state.store = ModelStore(make_sessionmaker(engine), blobs)
        app.state.events = VersionBroadcaster()
        try:
            yield
        finally:
            engine.dispose()

    async def readiness() -> dict[str, Any]:
        await run_in_threadpool(app.state.store.ping)
        return {"database": "ok"}

    app = create_service_app(
        "modelstate", routers=[routes.router, events.router], lifespan=lifespan,
        readiness=readiness,
    )
    return app
