"""Reverse proxy: `/v1/{service}/{rest}` → `<service url>/v1/{rest}`.

Method, query string, headers and body go through; the body is streamed both ways, so an SSE
stream from rollout reaches the client event by event. Hop-by-hop headers, `Host` and the
client's credentials stay behind (services trust the gateway, not the caller's key). A
non-admin key reaches only its own jobs (`gateway.scopes`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from urllib.parse import unquote

import httpx2
from fastapi import APIRouter, Request
from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse

from gateway import scopes
from gateway.deps import CurrentKey, JobOwnersDep, UpstreamsDep
from gateway.jobs import JobOwners
from gateway.keys import KeyIdentity
from gateway.request_body import read_capped
from gateway.upstreams import Upstreams
from services.common.errors import Unavailable, UpstreamError
from services.common.logs import request_id_var

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade",
})
# The request id is set explicitly; the caller's key must not travel further.
NOT_FORWARDED = HOP_BY_HOP | {"host", "authorization", "x-api-key", "x-request-id"}
# Our own request-id middleware stamps the response; the upstream's copy would duplicate it.
NOT_RETURNED = HOP_BY_HOP | {"x-request-id"}
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


async def forward(upstreams: Upstreams, service: str, request: Request, key: KeyIdentity,
                  owners: JobOwners) -> StreamingResponse:
    client = upstreams.client(service)
    dropped = NOT_FORWARDED
    content: bytes | AsyncIterator[bytes] | None = request.stream() if has_body(request) else None
    if not key.admin:
        checked = await authorize(request, service, key, owners)
        if checked is not None:  # the body was read to find its job: send what was checked
            content, dropped = checked, NOT_FORWARDED | {"content-length"}
    upstream_request = client.build_request(
        request.method,
        upstream_target(request, service),
        headers=forwarded_headers(request.headers.raw, dropped)
        + [(b"x-request-id", request_id_var.get().encode("latin-1"))],
        content=content,
    )
    try:
        upstream = await client.send(upstream_request, stream=True)
    except (httpx2.ConnectError, httpx2.ConnectTimeout) as exc:
        raise Unavailable(
            f"The {service} service is unreachable at {client.base_url}: {exc!r}",
            {"service": service},
        ) from exc
    except httpx2.TransportError as exc:
        raise UpstreamError(f"The {service} service failed to answer: {exc!r}",
                            {"service": service}) from exc
    response = StreamingResponse(upstream.aiter_raw(), status_code=upstream.status_code,
                                 background=BackgroundTask(upstream.aclose))
    # Raw bytes go back unchanged (still compressed if they were), so the upstream's own
    # Content-Length and Content-Encoding stay valid.
    response.raw_headers = forwarded_headers(upstream.headers.raw, NOT_RETURNED)
    return response


async def authorize(request: Request, service: str, key: KeyIdentity, owners: JobOwners
                    ) -> bytes | None:
    """Refuse a non-admin key's call on another key's job. Returns the body when the rule had
    to read it: re-encoded from what was checked, so the service cannot see another job_id
    than the one checked here (duplicate JSON keys, say)."""
    # Decoded as the service's server will decode it, so both see the same job id.
    path = unquote(upstream_target(request, service).split("?", 1)[0].removeprefix("/v1"))
    found = scopes.rule_for(service, request.method, path)
    body, content = None, None
    if found is not None and found[0].reads_body:
        body = scopes.parse_body(await read_capped(request, scopes.MAX_SCOPED_BODY))
        content = json.dumps(body).encode() if body is not None else b""
    for job_id in scopes.jobs_named(service, request.method, path, dict(request.query_params),
                                    body):
        await owners.check(key, job_id)
    return content


def upstream_target(request: Request, service: str) -> str:
    """`/v1/<rest>?<query>`, from the raw (still percent-encoded) path when the server gives it."""
    prefix = f"/v1/{service}"
    raw_path: bytes = request.scope.get("raw_path") or request.url.path.encode()
    path = raw_path.decode("latin-1")
    rest = path[len(prefix):] if path.startswith(prefix) else request.url.path[len(prefix):]
    query = request.url.query
    return f"/v1{rest}" + (f"?{query}" if query else "")


def forwarded_headers(raw: list[tuple[bytes, bytes]], dropped: frozenset[str]
                      ) -> list[tuple[bytes, bytes]]:
    # `Connection: foo` makes `foo` hop-by-hop too (RFC 9110 §7.6.1).
    listed = {
        token.strip().lower()
        for name, value in raw if name.lower() == b"connection"
        for token in value.decode("latin-1").split(",")
    }
    return [(name, value) for name, value in raw
            if (key := name.decode("latin-1").lower()) not in dropped and key not in listed]


def has_body(request: Request) -> bool:
    return "content-length" in request.headers or "transfer-encoding" in request.headers


async def proxy(service: str, path: str, request: Request, upstreams: UpstreamsDep,
                key: CurrentKey, owners: JobOwnersDep) -> StreamingResponse:
    """Forward to a Loom service: /v1/<service>/<rest> → <service>/v1/<rest>."""
    return await forward(upstreams, service, request, key, owners)


router = APIRouter(tags=["proxy"])
for _method in METHODS:  # one route per method, so each gets its own OpenAPI operation id
    router.add_api_route("/v1/{service}/{path:path}", proxy, methods=[_method],
                         operation_id=f"proxy_{_method.lower()}")
