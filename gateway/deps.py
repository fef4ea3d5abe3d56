"""Typed dependencies, so route signatures read plainly."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from gateway.auth import AuthCache
from gateway.keys import KeyIdentity
from gateway.settings import GatewaySettings
from gateway.upstreams import Upstreams
from services.common.db import transaction
from services.common.errors import Forbidden, Unauthorized
from services.common.http import ServiceClient


def get_session(request: Request) -> Iterator[Session]:
    with transaction(request.app.state.sessions) as session:
        yield session


def get_sessions(request: Request) -> sessionmaker[Session]:
    sessions: sessionmaker[Session] = request.app.state.sessions
    return sessions


def get_settings(request: Request) -> GatewaySettings:
    settings: GatewaySettings = request.app.state.settings
    return settings


def get_auth_cache(request: Request) -> AuthCache:
    cache: AuthCache = request.app.state.auth_cache
    return cache


def get_upstreams(request: Request) -> Upstreams:
    upstreams: Upstreams = request.app.state.upstreams
    return upstreams


def get_trainer(request: Request) -> ServiceClient:
    trainer: ServiceClient = request.app.state.trainer
    return trainer


def current_key(request: Request) -> KeyIdentity:
    identity: KeyIdentity | None = getattr(request.state, "api_key", None)
    if identity is None:  # only reachable if a route is exempted from the auth middleware
        raise Unauthorized("This endpoint needs an API key.")
    return identity


def admin_key(key: Annotated[KeyIdentity, Depends(current_key)]) -> KeyIdentity:
    if not key.admin:
        raise Forbidden(f"API key {key.name!r} is not an admin key; this endpoint needs one.")
    return key


# scope="function": the transaction commits before the response goes out, so a client never
# sees success for a write that then fails to commit.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
SessionsDep = Annotated[sessionmaker[Session], Depends(get_sessions)]
SettingsDep = Annotated[GatewaySettings, Depends(get_settings)]
AuthCacheDep = Annotated[AuthCache, Depends(get_auth_cache)]
UpstreamsDep = Annotated[Upstreams, Depends(get_upstreams)]
TrainerDep = Annotated[ServiceClient, Depends(get_trainer)]
CurrentKey = Annotated[KeyIdentity, Depends(current_key)]
AdminKey = Annotated[KeyIdentity, Depends(admin_key)]
