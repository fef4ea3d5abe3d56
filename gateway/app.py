"""The gateway app: Loom's public entry (auth, jobs, keys, stack health, proxy to services)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware

from gateway import compat
from gateway.admin import install_admin
from gateway.auth import routes as auth_routes
from gateway.auth.bootstrap import bootstrap_admin_key
from gateway.auth.dialects import ClientDialects
from gateway.auth.middleware import ApiKeyAuthMiddleware, AuthCache
from gateway.health import routes as health_routes
from gateway.jobs import routes as jobs_routes
from gateway.jobs.jobs import JobOwners
from gateway.models import ALEMBIC_DIR, VERSION_TABLE
from gateway.proxy import replica_routes
from gateway.proxy import routes as proxy_routes
from gateway.proxy.upstreams import Upstreams
from gateway.schemas import parse_trackers
from gateway.settings import GatewaySettings
from gateway.tasks import routes as task_routes
from gateway.trackers.mirror import TrackerMirror
from gateway.trackers.mirror import attach as attach_trackers
from services.common.app_factory import create_service_app, token_digest
from services.common.db import make_engine, make_sessionmaker, migrate
from services.common.service_token import client_of, service_token
from services.common.settings import LoomSettings
from services.trainer.client import TrainerClient
from services.worker import models as worker_models
from services.worker.app import create_celery
from services.worker.settings import WorkerSettings


def create_app(
    settings: GatewaySettings | None = None, worker_settings: WorkerSettings | None = None
) -> FastAPI:
    """`worker_settings`: the broker tasks are sent to; default: LOOM_WORKER_* with the
    gateway's data dir, database and service URLs."""
    settings = settings or GatewaySettings()
    worker_settings = worker_settings or WorkerSettings(
        **settings.model_dump(include=set(LoomSettings.model_fields))
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = settings.database_url_for("gateway")
        await run_in_threadpool(migrate, url, ALEMBIC_DIR, VERSION_TABLE)
        # The worker's tables too: the gateway inserts tasks when it dispatches them, and
        # may start before any worker (the worker migrates them at its start as well).
        await run_in_threadpool(
            migrate, url, worker_models.ALEMBIC_DIR, worker_models.VERSION_TABLE
        )
        engine = make_engine(url)
        app.state.sessions = make_sessionmaker(engine)
        app.state.trackers = TrackerMirror(
            parse_trackers(settings.trackers),
            settings.tracker_options(),
            app.state.metrics_registry,
            retries=settings.trackers_retries,
        )
        attach_trackers(app.state.sessions, app.state.trackers)
        app.state.bootstrap_key = await run_in_threadpool(
            bootstrap_admin_key, app.state.sessions, settings
        )
        app.state.auth_cache = AuthCache(settings.gateway_auth_cache_s)
        app.state.job_owners = JobOwners(app.state.sessions)
        app.state.upstreams = Upstreams(settings)
        app.state.replicas = app.state.upstreams.replicas
        app.state.service_digest = token_digest(service_token(settings))
        app.state.trainer = client_of(settings, TrainerClient)
        app.state.celery = create_celery(worker_settings)  # connects on the first send
        # Workers refresh their liveness row every stale_after_s: two missed ones mean gone.
        app.state.worker_stale_after_s = 2 * worker_settings.stale_after_s
        try:
            yield
        finally:
            app.state.celery.close()
            await app.state.trainer.aclose()
            await app.state.upstreams.aclose()
            await run_in_threadpool(app.state.trackers.close)
            engine.dispose()

    async def readiness() -> dict[str, Any]:
        def ping() -> None:
            with app.state.sessions() as session:
                session.execute(text("SELECT 1"))

        await run_in_threadpool(ping)
        return {"database": "ok"}

    # Our routes first: /v1/jobs, /v1/keys, /v1/tasks, /v1/health and /v1/rollout/replicas win
    # over the /v1/{service} proxy. Routes are matched in order, so the proxy (every sample
    # call) comes before the SDK-compatible APIs and the admin pages, whose paths it cannot
    # match anyway.
    app = create_service_app(
        "gateway",
        routers=[
            jobs_routes.router,
            auth_routes.router,
            health_routes.router,
            task_routes.router,
            replica_routes.router,
            proxy_routes.router,
        ],
        lifespan=lifespan,
        readiness=readiness,
        service_token=None,
    )
    app.state.settings = settings
    dialects = ClientDialects()
    compat.install(app, dialects)  # Tinker's and Weaver's APIs, after the proxy's routes
    install_admin(app, settings)  # /admin: pages, static files, session signer
    # Innermost (appended, not add_middleware): requests are already stamped with a request id
    # and counted when auth runs, so a 401 carries an X-Request-ID like any other answer.
    app.user_middleware.append(Middleware(ApiKeyAuthMiddleware, dialects=dialects))
    return app
