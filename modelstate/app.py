"""The model-state service: `create_app(settings)` builds the store at start-up and runs
garbage collection in the background."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from modelstate import events
from modelstate.blobstore import BlobStore
from modelstate.events import VersionBroadcaster
from modelstate.gc import Collector
from modelstate.routes import routers
from modelstate.schemas import RetentionPolicy
from modelstate.settings import ModelStateSettings
from modelstate.store import ModelStore
from services.common.app_factory import create_service_app
from services.common.db import make_engine, make_sessionmaker, migrate
from services.common.service_token import service_token

ALEMBIC_DIR = Path(__file__).parent / "alembic"
VERSION_TABLE = "alembic_version_modelstate"
log = logging.getLogger(__name__)


def create_app(settings: ModelStateSettings | None = None) -> FastAPI:
    settings = settings or ModelStateSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = settings.database_url_for("modelstate")
        await run_in_threadpool(migrate, url, ALEMBIC_DIR, VERSION_TABLE)
        engine = make_engine(url)
        blobs = BlobStore(settings.modelstate_blob_dir, settings.modelstate_max_file_bytes)
        store = ModelStore(make_sessionmaker(engine), blobs)
        default = RetentionPolicy(
            keep_last=settings.modelstate_keep_last,
            keep_ancestors=settings.modelstate_keep_ancestors,
        )
        collector = Collector(store, default, settings.modelstate_gc_grace_s)
        app.state.settings = settings
        app.state.store = store
        app.state.collector = collector
        app.state.events = VersionBroadcaster()
        gc_task = None
        if settings.modelstate_gc_interval_s > 0:
            gc_task = asyncio.create_task(
                collect_periodically(collector, settings.modelstate_gc_interval_s)
            )
        try:
            yield
        finally:
            if gc_task is not None:
                gc_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await gc_task
            engine.dispose()

    async def readiness() -> dict[str, Any]:
        await run_in_threadpool(app.state.store.ping)
        return {"database": "ok"}

    app = create_service_app(
        "modelstate",
        routers=[*routers, events.router],
        lifespan=lifespan,
        readiness=readiness,
        service_token=service_token(settings),
    )
    return app


async def collect_periodically(collector: Collector, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            report = await run_in_threadpool(collector.collect)
        except Exception:  # a failed round is retried at the next one
            log.exception("garbage collection failed")
            continue
        if report.versions_deleted or report.blobs_deleted or report.stray_entries_removed:
            log.info("garbage collection: %s", report.model_dump_json())
