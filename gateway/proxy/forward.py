"""Reverse proxy: `/v1/{service}/{rest}` → `<service url>/v1/{rest}`.

Method, query string, headers and body go through; the body is streamed both ways, so an SSE
stream from rollout reaches the client event by event. Hop-by-hop headers, `Host` and the
client's credentials stay behind (services trust the gateway, not the caller's key). A
non-admin key reaches only its own jobs (`gateway.auth.scopes`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx2
from fastapi import Request
from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse

from gateway.auth import scopes
from gateway.auth.keys import KeyIdentity
from gateway.jobs.jobs import JobOwners
from gateway.proxy.request_body import BodyLimits, body_too_large, capped_stream, read_capped
from gateway.proxy.routing import AFFINITY_HEADER
from gateway.proxy.send import Sent, send, send_routed
from gateway.proxy.target import ProxyTarget, proxy_target
from gateway.proxy.upstreams import Upstreams
from services.common.logs import request_id_var
from services.common.schemas import ErrorBody, ErrorEnvelope
from services.common.service_token import SERVICE_TOKEN_HEADER
from services.rollout.schemas import RolloutEvent

log = logging.getLogger(__name__)
ROLLOUT = "rollout"  # routed over its replicas (`gateway.proxy.send`)

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# The request id is set explicitly; the caller's key must not travel further, and a
# client-sent service token never reaches a service (the upstream client adds the real one).
NOT_FORWARDED = HOP_BY_HOP | {
    "host",
    "authorization",
    "x-api-key",
    "x-request-id",
    SERVICE_TOKEN_HEADER.lower(),
}
# Our own request-id middleware stamps the response; the upstream's copy would duplicate it.
NOT_RETURNED = HOP_BY_HOP | {"x-request-id"}
# `/v1/<service>` before the service's own path.
PREFIX_SEGMENTS = 2


async def forward(
    upstreams: Upstreams,
    service: str,
    request: Request,
    key: KeyIdentity,
    owners: JobOwners,
    limits: BodyLimits,
) -> StreamingResponse:
    client = upstreams.client(service)  # an unknown service is a 404 before anything is read
    target = request_target(request)
    limit = limits.for_key(key)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:  # refused before anything goes upstream
        raise body_too_large(limit)
    dropped = NOT_FORWARDED
    content: bytes | AsyncIterator[bytes] | None = (
        capped_stream(request, limit) if has_body(request) else None
    )
    if not key.admin:
        checked = await authorize(request, service, target, key, owners, limit)
        if checked is not None:  # the body was read to find its job: send what was checked
            content, dropped = checked, NOT_FORWARDED | {"content-length"}
    headers = forwarded_headers(request.headers.raw, dropped) + [
        (b"x-request-id", request_id_var.get().encode("latin-1"))
    ]
    if service == ROLLOUT:
        sent = await send_routed(
            upstreams.replicas,
            request.method,
            target,
            headers,
            content,
            request.headers.get(AFFINITY_HEADER),
        )
    else:
        upstream = await send(
            client,
            service,
            client.build_request(request.method, target.target, headers=headers, content=content),
        )
        sent = Sent(upstream, upstream.aclose)
    upstream = sent.response
    response = StreamingResponse(
        guarded(upstream, service, sent.release),
        status_code=upstream.status_code,
        background=BackgroundTask(sent.release),
    )
    # Raw bytes go back unchanged (still compressed if they were), so the upstream's own
    # Content-Length and Content-Encoding stay valid.
    response.raw_headers = forwarded_headers(upstream.headers.raw, NOT_RETURNED)
    return response


async def guarded(
    upstream: httpx2.Response, service: str, release: Callable[[], Awaitable[None]]
) -> AsyncIterator[bytes]:
    """The upstream's bytes. A stream of events (SSE, NDJSON) broken mid-way ends with an error
    event of its own kind, never silently; other bodies are cut short (the client sees a
    truncated response)."""
    tail = b""  # the last bytes sent: a closing event must start on a line of its own
    try:
        async for chunk in upstream.aiter_raw():
            tail = (tail + chunk)[-2:]
            yield chunk
    except httpx2.TransportError as exc:
        event = broken_stream_event(upstream.headers, service, exc, tail)
        if event is None:
            raise
        log.warning("the %s stream broke mid-way: %r", service, exc)
        yield event
    finally:
        await release()


def broken_stream_event(
    headers: httpx2.Headers, service: str, exc: Exception, tail: bytes
) -> bytes | None:
    """The closing error of a broken event stream, in the stream's own format, after what
    ends the event or line cut at `tail`; None for a body that is not an uncompressed event
    stream."""
    if headers.get("content-encoding"):
        return None
    media = headers.get("content-type", "").partition(";")[0].strip()
    error = ErrorBody(
        code="upstream_error",
        message=f"The {service} service's stream broke "
        f"before it finished ({exc!r}): what came before is complete; retry for "
        "the rest.",
        detail={"service": service},
    )
    if media == "text/event-stream":
        envelope = ErrorEnvelope(error=error).model_dump_json()
        end = b"" if tail in (b"", b"\n\n") else b"\n" if tail.endswith(b"\n") else b"\n\n"
        return end + f"data: {envelope}\n\ndata: [DONE]\n\n".encode()
    if media == "application/x-ndjson":
        end = b"" if not tail or tail.endswith(b"\n") else b"\n"
        return end + RolloutEvent(type="error", error=error).model_dump_json().encode() + b"\n"
    return None


async def authorize(
    request: Request,
    service: str,
    target: ProxyTarget,
    key: KeyIdentity,
    owners: JobOwners,
    limit: int,
) -> bytes | None:
    """Refuse a non-admin key's call on another key's job. Returns the body when the rule had
    to read it: re-encoded from what was checked, so the service cannot see another job_id
    than the one checked here (duplicate JSON keys, say)."""
    found = scopes.rule_for(service, request.method, target.path)
    body, content = None, None
    if found is not None and found[0].reads_body:
        body = scopes.parse_body(await read_capped(request, min(limit, scopes.MAX_SCOPED_BODY)))
        content = json.dumps(body).encode() if body is not None else b""
    for job_id in scopes.jobs_named(
        service,
        request.method,
        target.path,
        scopes.single_valued(request.query_params.multi_items()),
        body,
    ):
        await owners.check(key, job_id)
    return content


def request_target(request: Request) -> ProxyTarget:
    """The canonical `/v1/<rest>` of `/v1/<service>/<rest>`, from the raw (still
    percent-encoded) path: what is checked is what is sent."""
    raw_path: bytes = request.scope.get("raw_path") or request.url.path.encode()
    return proxy_target(raw_path.decode("latin-1"), PREFIX_SEGMENTS, request.url.query)


def forwarded_headers(
    raw: list[tuple[bytes, bytes]], dropped: frozenset[str]
) -> list[tuple[bytes, bytes]]:
    # `Connection: foo` makes `foo` hop-by-hop too (RFC 9110 §7.6.1).
    listed = {
        token.strip().lower()
        for name, value in raw
        if name.lower() == b"connection"
        for token in value.decode("latin-1").split(",")
    }
    return [
        (name, value)
        for name, value in raw
        if (key := name.decode("latin-1").lower()) not in dropped and key not in listed
    ]


def has_body(request: Request) -> bool:
    return "content-length" in request.headers or "transfer-encoding" in request.headers
