"""OpenTelemetry tracing for every Loom service: a server span per request (FastAPI's
instrumentation, added by `create_service_app`; this module stays free of the server stack,
since the SDK's HTTP client imports it) and a client span per call one service makes to
another, with the W3C `traceparent` header injected, so one request through the gateway,
rollout, reward, trainer and modelstate is one trace. Work a request leaves behind carries
its context too: a queued trainer operation runs in a span that is a child of the request that
queued it (`capture` at submit, `span_in` when it runs), and a background task's delivery in a
span linked to the request that submitted it (`inject`/`span_in(link=True)` through the
message's headers: deliveries come later, maybe hours and several times, so each is a trace
of its own that points back).

Off and free unless configured: the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) turns on OTLP/HTTP export, named by `OTEL_SERVICE_NAME`
(default `loom-<service>`) and shaped by the other `OTEL_*` variables; a tracer provider set by
the embedding program (a test's in-memory exporter) is used as it is. `OTEL_SDK_DISABLED=true`
keeps it off. Otherwise nothing is instrumented, wrapped or imported beyond the API.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping

import httpx2
from opentelemetry import context as otel_context
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


def capture() -> otel_context.Context | None:
    """The caller's trace context, for work that runs later elsewhere (another thread, a
    queue), or None outside a recorded trace: off, this is one context-variable read."""
    return otel_context.get_current() if trace.get_current_span().is_recording() else None


def inject(carrier: dict[str, str]) -> dict[str, str]:
    """`carrier` with the current trace context added (`traceparent`), when there is one."""
    if trace.get_current_span().is_recording():
        propagate.inject(carrier)
    return carrier


def extract(carrier: Mapping[str, str] | None) -> otel_context.Context | None:
    """The trace context `inject` put in `carrier`, or None without one."""
    if not carrier or "traceparent" not in carrier:
        return None
    return propagate.extract(dict(carrier))


@contextlib.contextmanager
def span_in(
    parent: otel_context.Context | None,
    name: str,
    *,
    link: bool = False,
    attributes: Mapping[str, str | int | float] | None = None,
) -> Iterator[None]:
    """Run the block in a span named `name`, a child of `parent` (`link`: the root of a new
    trace that links to `parent`); nothing at all when `parent` is None. An exception the
    block raises marks the span failed and goes on."""
    if parent is None:
        yield
        return
    span_context = trace.get_current_span(parent).get_span_context()
    options = (
        {"context": otel_context.Context(), "links": [trace.Link(span_context)]}
        if link
        else {"context": parent}
    )
    with trace.get_tracer("loom.work").start_as_current_span(
        name, attributes=dict(attributes or {}), **options
    ):
        yield


class _TracingTransport(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner
        self._tracer = trace.get_tracer("loom.http")

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        attributes = {
            "http.request.method": request.method,
            "url.full": str(request.url),
            "server.address": request.url.host,
        }
        with self._tracer.start_as_current_span(
            f"{request.method} {request.url.path}",
            kind=trace.SpanKind.CLIENT,
            attributes=attributes,
        ) as span:
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


def flush_spans(timeout_ms: int = 5_000) -> None:
    """Export what is buffered (a process about to exit); nothing when tracing is off."""
    flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if flush is not None:
        flush(timeout_ms)


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
