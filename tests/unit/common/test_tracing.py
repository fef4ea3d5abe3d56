"""Tracing is off and free unless configured; on, a request's id is its trace id and a call
to another service carries the trace context."""

from __future__ import annotations

import httpx2
import pytest
from fastapi import APIRouter, Request

from services.common.app_factory import create_service_app
from services.common.http_pool import pooled_transport
from services.common.operations import OperationQueue
from services.common.tracing import capture, extract, inject, span_in, traced, tracing_enabled
from tests.support.tracing import in_memory_tracing

LIMITS = httpx2.Limits(max_connections=1)


@pytest.fixture(autouse=True)
def no_otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_SDK_DISABLED",
    ):
        monkeypatch.delenv(name, raising=False)


def echo_app() -> object:
    router = APIRouter()

    @router.get("/echo")
    async def echo(request: Request) -> dict[str, str | None]:
        return {"traceparent": request.headers.get("traceparent")}

    return create_service_app("reward", routers=[router], service_token=None)


def test_without_configuration_nothing_is_instrumented_or_wrapped() -> None:
    assert not tracing_enabled()
    transport = pooled_transport(LIMITS)
    assert isinstance(transport, httpx2.AsyncHTTPTransport)  # not wrapped
    assert not getattr(echo_app(), "_is_instrumented_by_opentelemetry", False)


async def test_without_configuration_queued_work_and_messages_carry_no_context() -> None:
    assert capture() is None and inject({}) == {} and extract({}) is None
    with span_in(None, "nothing"):
        pass
    queue = OperationQueue()
    op = queue.submit("model", "forward", lambda: 1)
    assert (await queue.wait(op.id, 5)).result == 1
    queue.shutdown()


async def test_queued_work_runs_in_a_child_of_the_submitter_and_a_message_links_back() -> None:
    from opentelemetry import trace

    with in_memory_tracing() as finished:
        queue = OperationQueue()
        with trace.get_tracer("test").start_as_current_span("submit"):
            op = queue.submit("model", "optim_step", lambda: 1)
            carrier = inject({})
        assert (await queue.wait(op.id, 5)).result == 1
        queue.shutdown()
        with span_in(extract(carrier), "delivery", link=True):
            pass
        spans = {s.name: s for s in finished()}
    submit, run, delivery = spans["submit"], spans["operation optim_step"], spans["delivery"]
    assert (run.trace_id, run.parent_id) == (submit.trace_id, submit.span_id)
    assert run.attributes["loom.operation_id"] == op.id
    assert delivery.parent_id is None and delivery.trace_id != submit.trace_id
    assert delivery.links == ((submit.trace_id, submit.span_id),)


def test_sdk_disabled_wins_over_an_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not tracing_enabled()


async def test_a_request_id_is_the_trace_id_and_calls_carry_the_context() -> None:
    with in_memory_tracing() as finished:
        assert tracing_enabled()
        app = echo_app()
        assert getattr(app, "_is_instrumented_by_opentelemetry", False)
        transport = traced(httpx2.ASGITransport(app=app))
        assert transport is not None
        async with httpx2.AsyncClient(transport=transport, base_url="http://reward") as client:
            response = await client.get("/echo")
        spans = finished()
    assert response.status_code == 200
    traceparent = response.json()["traceparent"]
    assert traceparent is not None
    trace_id = traceparent.split("-")[1]
    assert response.headers["x-request-id"] == trace_id
    [server] = [
        s
        for s in spans
        if s.service == "reward"
        and s.parent_id
        and s.name.startswith("GET /echo")
        and s.attributes.get("loom.request_id")
    ]
    assert server.trace_id == trace_id and server.attributes["loom.request_id"] == trace_id
    [client_span] = [s for s in spans if s.attributes.get("url.full") == "http://reward/echo"]
    assert server.parent_id == client_span.span_id
