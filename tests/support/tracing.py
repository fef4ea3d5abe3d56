"""Tracing in tests: an in-memory exporter for spans of this process, an OTLP/HTTP receiver for
spans other processes export (the real exporter, configured by the standard variables)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request, Response


@dataclass(frozen=True)
class SpanSeen:
    name: str
    service: str  # in memory: loom.service (the app that made it); by OTLP: service.name
    trace_id: str
    span_id: str
    parent_id: str | None
    attributes: dict[str, object] = field(default_factory=dict)
    links: tuple[tuple[str, str], ...] = ()  # (trace id, span id) of each span it links to


@contextmanager
def in_memory_tracing() -> Iterator[Callable[[], list[SpanSeen]]]:
    """This process's tracer provider, exporting to memory, for apps built inside the block
    (it yields what was finished so far); the global provider is unset again after it
    (OpenTelemetry sets it once per process, so its private latch is reset, as its own test
    utilities do)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.util._once import Once

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    def finished() -> list[SpanSeen]:
        seen = []
        for span in exporter.get_finished_spans():
            context, parent = span.get_span_context(), span.parent
            attributes = dict(span.attributes or {})
            seen.append(
                SpanSeen(
                    name=span.name,
                    service=str(attributes.get("loom.service", "")),
                    trace_id=format(context.trace_id, "032x"),
                    span_id=format(context.span_id, "016x"),
                    parent_id=format(parent.span_id, "016x") if parent else None,
                    attributes=attributes,
                    links=tuple(
                        (
                            format(link.context.trace_id, "032x"),
                            format(link.context.span_id, "016x"),
                        )
                        for link in span.links
                    ),
                )
            )
        return seen

    try:
        yield finished
    finally:
        provider.shutdown()
        trace._TRACER_PROVIDER_SET_ONCE = Once()
        trace._TRACER_PROVIDER = None


def otlp_receiver(spans: list[SpanSeen]) -> FastAPI:
    """An OTLP/HTTP (protobuf) trace receiver: what a collector would be, keeping the spans."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    app = FastAPI()

    @app.post("/v1/traces")
    async def receive(request: Request) -> Response:
        exported = ExportTraceServiceRequest()
        exported.ParseFromString(await request.body())
        for resource_spans in exported.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    attributes = {a.key: a.value.string_value for a in span.attributes}
                    spans.append(
                        SpanSeen(
                            name=span.name,
                            service=resource.get("service.name", ""),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex() or None,
                            attributes=attributes,
                            links=tuple(
                                (link.trace_id.hex(), link.span_id.hex()) for link in span.links
                            ),
                        )
                    )
        return Response(
            ExportTraceServiceResponse().SerializeToString(), media_type="application/x-protobuf"
        )

    return app
