"""Every Loom service is built by `create_service_app`: the same health, readiness, metrics,
request ids and error envelope, so a reader learns the shape once."""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from sqlalchemy.exc import DataError, InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.common.errors import InvalidInput, LoomError, Unavailable
from services.common.logs import request_id_var
from services.common.schemas import Health
from services.common.service_token import SERVICE_TOKEN_HEADER
from services.common.tracing import (
    EXCLUDED_URLS,
    current_trace_id,
    note_request_id,
    tracing_enabled,
)

log = logging.getLogger("loom")

REQUEST_ID_HEADER = "X-Request-ID"
ReadinessCheck = Callable[[], Awaitable[dict[str, Any]]]
Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


def create_service_app(
    service: str,
    *,
    routers: list[APIRouter],
    lifespan: Lifespan | None = None,
    service_token: str | None,
    readiness: ReadinessCheck | None = None,
    version: str = "0.1.0",
) -> FastAPI:
    """`service_token`: what every caller must send (see `services.common.service_token`);
    None only for the gateway, whose callers are users with API keys. Required, so that no
    service is built open by omission."""
    app = FastAPI(title=f"Loom {service}", version=version, lifespan=lifespan)
    app.state.service = service
    app.state.readiness = readiness
    registry = CollectorRegistry()
    app.state.metrics_registry = registry
    install_error_handlers(app)
    if service_token is not None:
        # Innermost: a refused request is still counted and carries its request id.
        app.add_middleware(ServiceTokenMiddleware, token=service_token)
    app.add_middleware(MetricsMiddleware, service=service, registry=registry)
    app.add_middleware(RequestIdMiddleware)
    app.include_router(_ops_router(service, version))
    for router in routers:
        app.include_router(router)
    _instrument(app, service)  # outermost, when tracing is on: spans see the whole request
    return app


def _instrument(app: FastAPI, service: str) -> None:
    """A server span per request, joined to the caller's trace (services.common.tracing)."""
    if not tracing_enabled(service):
        return
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    from opentelemetry.trace import Span

    def name_service(span: Span, _scope: dict[str, Any]) -> None:
        if span.is_recording():
            span.set_attribute("loom.service", service)

    FastAPIInstrumentor.instrument_app(
        app, server_request_hook=name_service, excluded_urls=EXCLUDED_URLS
    )


def _ops_router(service: str, version: str) -> APIRouter:
    router = APIRouter(tags=["ops"])

    @router.get("/healthz", response_model=Health)
    async def healthz() -> Health:
        return Health(service=service, status="ok", version=version)

    @router.get("/readyz", response_model=Health)
    async def readyz(request: Request) -> Response:
        check: ReadinessCheck | None = request.app.state.readiness
        try:
            detail = await check() if check else {}
        except Exception as exc:  # readiness reports, it does not raise
            body = Health(
                service=service, status="not_ready", version=version, detail={"reason": str(exc)}
            )
            return JSONResponse(body.model_dump(), status_code=503)
        return JSONResponse(
            Health(service=service, status="ready", version=version, detail=detail).model_dump()
        )

    @router.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        return Response(
            generate_latest(request.app.state.metrics_registry), media_type=CONTENT_TYPE_LATEST
        )

    return router


# --- errors -------------------------------------------------------------------------------


def error_response(status_code: int, code: str, message: str, detail: Any = None) -> JSONResponse:
    body = {"error": {"code": code, "message": message, "detail": json_safe(detail)}}
    return JSONResponse(body, status_code=status_code)


def json_safe(value: Any) -> Any:
    """`value` with NaN and the infinities spelled as strings: an error often echoes the bad
    input, and JSON has no such numbers (rendering them would turn a 4xx into a 500)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def validation_error(exc: RequestValidationError) -> InvalidInput:
    """A request body FastAPI could not parse, as a 422 naming the first bad fields."""
    errors = [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")}
        for e in exc.errors()
    ]
    summary = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors[:5])
    return InvalidInput(f"Invalid request: {summary}", errors)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(LoomError)
    async def _loom(_request: Request, exc: LoomError) -> JSONResponse:
        if exc.status_code >= 500:
            log.error("%s: %s", exc.code, exc.message)
        return error_response(exc.status_code, exc.code, exc.message, exc.detail)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        error = validation_error(exc)
        return error_response(error.status_code, error.code, error.message, error.detail)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail))

    @app.exception_handler(DataError)
    async def _unstorable(_request: Request, exc: DataError) -> JSONResponse:
        # The database refused a value of the request (PostgreSQL: a NUL character in text, a
        # number out of range); its transaction rolled back, so nothing was written.
        reason = str(exc.orig).splitlines()[0] if exc.orig else type(exc).__name__
        log.warning("value refused by the database: %s", reason)
        return error_response(
            422, "invalid_input", f"The request holds a value the database cannot store: {reason}."
        )

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    async def _database_down(_request: Request, exc: Exception) -> JSONResponse:
        return database_unavailable(exc)

    @app.exception_handler(Exception)
    async def _unhandled(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(500, "internal_error", f"Internal error: {type(exc).__name__}")


def database_unavailable(exc: Exception) -> JSONResponse:
    """The database is unreachable or dropped the connection (a restart, a failover): an
    outage, not a bug, so a 503. The transaction rolled back; the pool reconnects on a later
    call. Also for middlewares, which the app's exception handlers do not cover."""
    log.warning("database unavailable: %s", str(exc).splitlines()[0][:300])
    return error_response(
        503,
        Unavailable.code,
        "The database is unavailable (restarting or unreachable); nothing was written. Try "
        "again shortly.",
    )


# --- middlewares (pure ASGI, so streaming responses pass through untouched) ----------------


class RequestIdMiddleware:
    """Accept or mint an `X-Request-ID`, expose it to logs, echo it on the response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        # A new request's id is its trace id when tracing is on: either finds the other.
        request_id = incoming[:128] or current_trace_id() or uuid.uuid4().hex
        note_request_id(request_id)
        token = request_id_var.set(request_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode("latin-1")))
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            request_id_var.reset(token)


class ServiceTokenMiddleware:
    """Refuse (401) any request without the service token, before routing: no handler runs,
    no body is read. Health, readiness and metrics stay open for probes and Prometheus.

    The token is compared as SHA-256 digests with `hmac.compare_digest`: constant time, and
    equal lengths whatever the caller sends."""

    OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.digest = token_digest(token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" or scope["path"] in self.OPEN_PATHS or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":  # none today; one added later is guarded too
            await send({"type": "websocket.close", "code": 1008})
            return
        refused = error_response(
            401,
            "unauthorized",
            f"This Loom service takes requests only with the service token in the "
            f"{SERVICE_TOKEN_HEADER} header: set LOOM_SERVICE_TOKEN (or LOOM_SERVICE_TOKEN_FILE) "
            f"to the same value for every Loom process, or call through the gateway.",
        )
        await refused(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        return presents_token(scope["headers"], self.digest)


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def presents_token(headers: list[tuple[bytes, bytes]], digest: bytes) -> bool:
    """Whether raw ASGI `headers` carry exactly one service token, and the one of `digest`."""
    name = SERVICE_TOKEN_HEADER.lower().encode("latin-1")
    sent = [value for key, value in headers if key == name]
    return len(sent) == 1 and hmac.compare_digest(hashlib.sha256(sent[0]).digest(), digest)


class MetricsMiddleware:
    def __init__(self, app: ASGIApp, service: str, registry: CollectorRegistry) -> None:
        self.app = app
        self.requests = Counter(
            "loom_http_requests",
            "HTTP requests",
            ["service", "method", "route", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "loom_http_request_seconds",
            "HTTP request latency (to response start)",
            ["service", "method", "route"],
            registry=registry,
        )
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                route = _route_template(scope)
                self.latency.labels(self.service, scope["method"], route).observe(
                    time.perf_counter() - start
                )
            await send(message)

        try:
            await self.app(scope, receive, send_observed)
        finally:
            self.requests.labels(
                self.service, scope["method"], _route_template(scope), str(status)
            ).inc()


def _route_template(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"
