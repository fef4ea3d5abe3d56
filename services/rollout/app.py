"""The rollout service: one vLLM engine, Loom's sampling API and OpenAI-compatible endpoints.

The engine starts in the background (tens of seconds on CPU), so `/healthz` answers at once
and `/readyz` turns ready once the engine is started and warmed up."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from modelstate.client import ModelStateClient
from services.common.app_factory import create_service_app
from services.common.base_models import resolve_base_model
from services.common.busy import BusyClock
from services.common.db import make_engine, make_sessionmaker, migrate
from services.common.errors import Unavailable
from services.common.http import DEFAULT_TIMEOUT
from services.common.service_token import client_of, service_headers, service_token
from services.reward.client import RewardClient
from services.rollout import routes
from services.rollout.agent_loop import AgentLoop
from services.rollout.announce import Announcer
from services.rollout.capture import Capture, TrajectoryStore
from services.rollout.engine import RolloutEngine
from services.rollout.fanout import Fetcher, GatewayPeers
from services.rollout.gateway_calls import GatewayReplicas
from services.rollout.openai import routes as openai_routes
from services.rollout.openai.chat import ChatCompletions
from services.rollout.openai.completions import Completions
from services.rollout.openai.serving import OpenAIServing
from services.rollout.peers import RewardScorer, SandboxTools
from services.rollout.pins import PinKeeper, holder_name
from services.rollout.rollouts import Rollouts
from services.rollout.sampling import Sampler
from services.rollout.schemas import ReplicaHeartbeat
from services.rollout.settings import RolloutSettings
from services.rollout.versions import Versions
from services.sandbox.client import SandboxClient

ALEMBIC_DIR = Path(__file__).parent / "alembic"
VERSION_TABLE = "alembic_version_rollout"
log = logging.getLogger(__name__)


def create_app(settings: RolloutSettings | None = None) -> FastAPI:
    settings = settings or RolloutSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        model_path = await run_in_threadpool(
            resolve_base_model, settings.rollout_model, settings.data_dir
        )
        engine = RolloutEngine(settings, model_path, busy)
        store = ModelStateClient.from_settings(settings)
        gateway = client_of(settings, GatewayReplicas, retries=0)  # the next beat retries
        peers = httpx2.AsyncClient(headers=service_headers(settings), timeout=DEFAULT_TIMEOUT)
        fetcher = Fetcher(
            store,
            GatewayPeers(gateway, settings.replica_id),
            peers,
            settings.cache_dir,
            in_place=settings.rollout_store_local_reads,
        )
        app.state.held_files = fetcher.held
        versions = Versions(
            engine,
            store,
            fetcher.materialize,
            base_model=settings.rollout_model,
            base_path=model_path,
            max_loras=settings.rollout_max_loras,
        )
        sampler = Sampler(engine, versions)
        url = settings.database_url_for("rollout")
        await run_in_threadpool(migrate, url, ALEMBIC_DIR, VERSION_TABLE)
        database = make_engine(url)
        capture = Capture(TrajectoryStore(make_sessionmaker(database)), versions)
        serving = OpenAIServing(sampler, versions, settings.rollout_model, capture)
        app.state.settings = settings
        app.state.engine = engine
        app.state.versions = versions
        app.state.sampler = sampler
        app.state.capture = capture
        app.state.openai = serving
        app.state.completions = Completions(serving)
        app.state.chat = ChatCompletions(serving)
        sandbox = client_of(settings, SandboxClient)
        reward = client_of(settings, RewardClient)
        agent_loop = AgentLoop(sampler, SandboxTools(sandbox), RewardScorer(reward))
        app.state.rollouts = Rollouts(agent_loop, versions)

        keeper = PinKeeper(store, holder_name(settings.url_of("rollout")), versions.pinned_keys)

        def heartbeat() -> ReplicaHeartbeat:
            resident = versions.resident()
            return ReplicaHeartbeat(
                url=settings.url_of("rollout"),
                ready=engine.ready,
                versions=[*([resident.full] if resident.full else []), *resident.loras],
                requests_in_flight=engine.requests_in_flight,
                tokens_in_flight=engine.tokens_in_flight,
                heartbeat_s=settings.rollout_heartbeat_s,
            )

        announcer = app.state.announcer = Announcer(
            gateway, settings.replica_id, settings.rollout_heartbeat_s, heartbeat
        )
        announcing = (
            asyncio.create_task(announcer.run(), name="rollout-announce")
            if settings.rollout_announce
            else None
        )

        async def run() -> None:
            await engine.start()
            freeze_startup_heap()
            await asyncio.gather(versions.follow_publications(), keeper.run())

        task = asyncio.create_task(run(), name="rollout-engine")
        task.add_done_callback(_log_failure)
        try:
            yield
        finally:
            if announcing is not None:
                announcing.cancel()
                await announcer.leave()  # before the engine stops: no new request comes
            task.cancel()
            for running in (task, announcing):
                if running is not None:
                    with contextlib.suppress(BaseException):
                        await running
            engine.shutdown()
            database.dispose()
            await asyncio.gather(
                store.aclose(), sandbox.aclose(), reward.aclose(), gateway.aclose(), peers.aclose()
            )

    async def readiness() -> dict[str, Any]:
        engine: RolloutEngine = app.state.engine
        if not engine.ready:
            engine.llm  # noqa: B018 -- raises Unavailable with the reason (starting or failed)
            raise Unavailable("The rollout engine is warming up.")
        return {
            "model": settings.rollout_model,
            "startup_s": round(engine.startup_seconds or 0, 1),
            "warmup_s": round(engine.warmup_seconds or 0, 1),
        }

    app = create_service_app(
        "rollout",
        routers=[routes.router, openai_routes.router],
        lifespan=lifespan,
        service_token=service_token(settings),
    )
    busy = BusyClock(
        "loom_rollout_engine_busy_seconds",
        "Seconds the engine had at least one generation in flight",
    )
    app.state.metrics_registry.register(busy)
    app.state.readiness = readiness  # set after: it reads the engine the lifespan puts on `app`
    return app


def freeze_startup_heap() -> None:
    """Move what start-up allocated (imports, the engine, its tokenizer: millions of objects)
    out of the garbage collector's reach. A full collection otherwise walks all of it, about
    0.4 s of CPU each time samples' objects trigger one (bench/logprobs_frontend.py); vLLM
    does the same in its engine process."""
    gc.collect()
    gc.freeze()


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("rollout engine task failed", exc_info=task.exception())
