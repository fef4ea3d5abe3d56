"""The proxy's route: `/v1/{service}/{rest}`, every method, forwarded by `gateway.proxy.forward`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import StreamingResponse

from gateway.auth.deps import CurrentKey
from gateway.deps import BodyLimitsDep, JobOwnersDep, UpstreamsDep
from gateway.proxy.forward import forward

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


async def proxy(
    service: str,
    path: str,
    request: Request,
    upstreams: UpstreamsDep,
    key: CurrentKey,
    owners: JobOwnersDep,
    limits: BodyLimitsDep,
) -> StreamingResponse:
    """Forward to a Loom service: /v1/<service>/<rest> → <service>/v1/<rest>."""
    return await forward(upstreams, service, request, key, owners, limits)


router = APIRouter(tags=["proxy"])
for _method in METHODS:  # one route per method, so each gets its own OpenAPI operation id
    router.add_api_route(
        "/v1/{service}/{path:path}",
        proxy,
        methods=[_method],
        operation_id=f"proxy_{_method.lower()}",
    )
