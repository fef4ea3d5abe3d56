"""Who is calling, as route dependencies: any valid key, an admin key, or one of Loom's own
services (the service token)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gateway.auth.keys import KeyIdentity
from services.common.app_factory import presents_token
from services.common.errors import Forbidden, Unauthorized
from services.common.service_token import SERVICE_TOKEN_HEADER


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
        raise Unauthorized(
            f"This endpoint is for Loom's services: send the service token in "
            f"the {SERVICE_TOKEN_HEADER} header."
        )


CurrentKey = Annotated[KeyIdentity, Depends(current_key)]
AdminKey = Annotated[KeyIdentity, Depends(admin_key)]
ServiceCaller = Annotated[None, Depends(service_caller)]
