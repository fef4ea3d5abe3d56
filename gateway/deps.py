"""Typed dependencies on the app's state (sessions, settings, clients), so route signatures read
plainly. Who is calling (a key, an admin, a service) is `gateway.auth.deps`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from celery import Celery
from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from gateway.auth.middleware import AuthCache
from gateway.jobs.jobs import JobOwners
from gateway.proxy.replicas import ReplicaRegistry
from gateway.proxy.request_body import BodyLimits
from gateway.proxy.upstreams import Upstreams
from gateway.settings import GatewaySettings
from services.common.db import transaction
from services.common.deps import app_state
from services.trainer.client import TrainerClient


def get_session(request: Request) -> Iterator[Session]:
    with transaction(request.app.state.sessions) as session:
        yield session


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
JobOwnersDep = Annotated[JobOwners, Depends(app_state("job_owners"))]
TrainerDep = Annotated[TrainerClient, Depends(app_state("trainer"))]
CeleryDep = Annotated[Celery, Depends(app_state("celery"))]  # sends background tasks
BodyLimitsDep = Annotated[BodyLimits, Depends(body_limits)]
