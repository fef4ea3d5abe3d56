"""The SDK protocols the gateway serves besides Loom's own: Tinker's and Weaver's REST APIs
(`tinker`, `weaver`), over what they share (`common`), installed on the gateway by
`install`: the gateway's core knows none of them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI

from gateway.auth.dialects import ClientDialects
from gateway.compat.tinker import routes as tinker_routes
from gateway.compat.tinker.service import TinkerService
from gateway.compat.weaver import errors as weaver_errors
from gateway.compat.weaver import routes as weaver_routes
from gateway.compat.weaver.service import WeaverService
from gateway.proxy.replica_transport import ReplicaTransport
from services.common.service_token import client_of
from services.rollout.client import RolloutClient


def install(app: FastAPI, dialects: ClientDialects) -> None:
    """Tinker's and Weaver's routes, how their SDKs present a key and read a refusal, and
    their services, made when the gateway starts (after its own state: database, trainer
    client, replicas)."""
    router = APIRouter(lifespan=_services)
    router.include_router(tinker_routes.router)
    router.include_router(weaver_routes.router)
    app.include_router(router)
    dialects.register(tinker_routes.DIALECT)
    dialects.register(weaver_errors.DIALECT)


@asynccontextmanager
async def _services(app: FastAPI) -> AsyncIterator[None]:
    state, settings = app.state, app.state.settings
    # Tinker's and Weaver's samples are routed over the replicas as /v1/rollout/* is.
    rollout = client_of(settings, RolloutClient, transport=ReplicaTransport(state.replicas))
    state.tinker = TinkerService(
        state.sessions, state.trainer, rollout, settings.gateway_sdk_base_models, settings.data_dir
    )
    state.weaver = WeaverService(
        state.sessions, state.trainer, rollout, settings.gateway_sdk_base_models, settings.data_dir
    )
    try:
        yield
    finally:
        await rollout.aclose()
