"""The reward service: verifiers and batch scoring."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from services.common.app_factory import create_service_app
from services.common.service_token import client_of, service_token
from services.reward.functions import FunctionStore
from services.reward.routes import router
from services.reward.scoring import Scorer
from services.reward.settings import RewardSettings
from services.reward.verifiers import MathParams, run_verifier, warm_up
from services.reward.workers import WorkerPool
from services.sandbox.client import SandboxClient


def create_app(settings: RewardSettings | None = None) -> FastAPI:
    settings = settings or RewardSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = WorkerPool(settings.reward_workers, initializer=warm_up)
        sandbox = client_of(settings, SandboxClient)
        functions = FunctionStore(settings.data_dir / "reward-functions")
        app.state.functions = functions
        try:
            # Start a worker and check it can verify before declaring the service up.
            await pool.run(60.0, run_verifier, "math", "1/2", "0.5", MathParams())
            app.state.scorer = Scorer(
                pool,
                settings.reward_item_timeout_s,
                sandbox,
                settings.reward_sandbox_concurrency,
                functions,
                threads=settings.reward_workers,
            )
            yield
        finally:
            if hasattr(app.state, "scorer"):
                app.state.scorer.close()
            await sandbox.aclose()
            await pool.shutdown()

    async def readiness() -> dict[str, Any]:
        return {"workers": settings.reward_workers}

    app = create_service_app(
        "reward",
        routers=[router],
        lifespan=lifespan,
        readiness=readiness,
        service_token=service_token(settings),
    )
    app.state.settings = settings
    return app
