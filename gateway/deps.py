"""Typed dependencies, so route signatures read plainly."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from celery import Celery
from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from gateway.auth.keys import KeyIdentity
from gateway.auth.middleware import AuthCache
from gateway.jobs.jobs import JobOwners
from gateway.proxy.replicas import ReplicaRegistry
from gateway.proxy.request_body import BodyLimits
from gateway.proxy.upstreams import Upstreams
from gateway.settings import GatewaySettings
from services.common.app_factory import presents_token
from services.common.db import transaction
from services.common.deps import app_state
from services.common.errors import Forbidden, Unauthorized
from services.common.http import ServiceClient
from services.common.service_token import SERVICE_TOKEN_HEADER


def get_session(request: Request) -> Iterator[Session]:
    with transaction(request.app.state.sessions) as session:
        yield session


# The key checks are async only to run on the event loop (see `app_state`): they do no I/O.
async def current_key(request: Request) -> KeyIdentity:
    identity: KeyIdentity | None = getattr(request.state, "api_key", None)
    if identity is None:  # only reachable if a route is exempted from the auth middleware
        raise Unauthorized("This endpoint needs an API key.")
    return identity


async def admin_key(key: Annotated[KeyIdentity, Depends(current_key)]) -> KeyIdentity:
    if not key.admin:
        raise Forbidden(f"API key {key.name!r} is not an admin key; this endpoint needs one.")
    return key


async def service_caller(request: Request) -> None:
    """Routes Loom's own services call (under `/v1/internal/`, which the API-key middleware
    lets through) ask the service token instead of a key."""
    if not presents_token(request.scope["headers"], request.app.state.service_digest):
        raise Unauthorized(f"This endpoint is for Loom's services: send the service token in "
                           f"the {SERVICE_TOKEN_HEADER} header.")


async def body_limits(request: Request) -> BodyLimits:
    return BodyLimits.from_settings(request.app.state.settings)


# scope="function": the transaction commits before the response goes out, so a client never
# sees success for a write that then fails to commit.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
SessionsDep = Annotated[sessionmaker[Session], Depends(app_state("sessions"))]
SettingsDep = Annotated[GatewaySettings, Depends(app_state("settings"))]
AuthCacheDep = Annotated[AuthCache, Depends(app_state("auth_cache"))]
UpstreamsDep = Annotated[Upstreams, Depends(app_state("upstreams"))]
ReplicasDep = Annotated[ReplicaRegistry, Depends(app_state("replicas"))]
ServiceCaller = Annotated[None, Depends(service_caller)]
JobOwnersDep = Annotated[JobOwners, Depends(app_state("job_owners"))]
TrainerDep = Annotated[ServiceClient, Depends(app_state("trainer"))]
CeleryDep = Annotated[Celery, Depends(app_state("celery"))]  # sends background tasks
CurrentKey = Annotated[KeyIdentity, Depends(current_key)]
AdminKey = Annotated[KeyIdentity, Depends(admin_key)]
BodyLimitsDep = Annotated[BodyLimits, Depends(body_limits)]
