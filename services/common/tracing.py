"""OpenTelemetry tracing for every Loom service: a server span per request (FastAPI's
instrumentation, added by `create_service_app`; this module stays free of the server stack,
since the SDK's HTTP client imports it) and a client span per call one service makes to
another, with the W3C `traceparent` header injected, so one request through the gateway,
rollout, reward, trainer and modelstate is one trace.

Off and free unless configured: the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) turns on OTLP/HTTP export, named by `OTEL_SERVICE_NAME`
(default `loom-<service>`) and shaped by the other `OTEL_*` variables; a tracer provider set by
the embedding program (a test's in-memory exporter) is used as it is. `OTEL_SDK_DISABLED=true`
keeps it off. Otherwise nothing is instrumented, wrapped or imported beyond the API.
"""

from __future__ import annotations

import os
import threading

import httpx2
from opentelemetry import propagate, trace

_OTLP_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
# Probes and scrapes would be most of the spans and tell nothing.
EXCLUDED_URLS = "/healthz,/readyz,/metrics"
_setup_lock = threading.Lock()


def tracing_enabled(service: str | None = None) -> bool:
    """Whether spans are recorded; sets up OTLP export the first time it is configured."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    if _has_provider():
        return True
    if not any(os.environ.get(name) for name in _OTLP_VARIABLES):
        return False
    with _setup_lock:
        if not _has_provider():
            trace.set_tracer_provider(_otlp_provider(service))
    return True


def traced(transport: httpx2.AsyncBaseTransport) -> httpx2.AsyncBaseTransport:
    """`transport`, sending each request in a client span with the trace context in its
    headers when tracing is on; `transport` itself otherwise."""
    return _TracingTransport(transport) if tracing_enabled() else transport


def current_trace_id() -> str | None:
    """The current span's trace id (32 hex digits), or None outside a recorded trace."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def note_request_id(request_id: str) -> None:
    """Put the request id on the current server span: each finds the other."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute("loom.request_id", request_id)


class _TracingTransport(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner
        self._tracer = trace.get_tracer("loom.http")

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        attributes = {"http.request.method": request.method, "url.full": str(request.url),
                      "server.address": request.url.host}
        with self._tracer.start_as_current_span(f"{request.method} {request.url.path}",
                                                kind=trace.SpanKind.CLIENT,
                                                attributes=attributes) as span:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            request.headers.update(carrier)
            response = await self._inner.handle_async_request(request)
            span.set_attribute("http.response.status_code", response.status_code)
            if response.status_code >= 500:
                span.set_status(trace.StatusCode.ERROR)
            return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def _has_provider() -> bool:
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def _otlp_provider(service: str | None) -> trace.TracerProvider:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME") or (f"loom-{service}" if service else "loom")
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider
