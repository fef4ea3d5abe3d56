"""services/common: error mapping, the app factory's shared behaviour, ordered operations."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable

import httpx2
import pytest
from fastapi import APIRouter, FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from pydantic import BaseModel

from gateway.app import create_app as create_gateway
from services.common.app_factory import create_service_app
from services.common.errors import (
    Conflict,
    InvalidInput,
    InvalidTransition,
    LoomError,
    NotFound,
    Unavailable,
    error_from_envelope,
)
from services.common.logs import configure_logging
from services.common.operations import OperationQueue
from services.common.schemas import OperationStatus
from services.rollout.app import create_app as create_rollout


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (409, {"error": {"code": "invalid_transition", "message": "m"}}, InvalidTransition),
        (409, {"error": {"code": "something_new", "message": "m"}}, Conflict),
        (404, {"error": {"code": "not_found", "message": "m"}}, NotFound),
        (418, "teapot", InvalidInput),
        (503, "<html>", Unavailable),
        (500, None, LoomError),
    ],
)
def test_envelopes_map_to_typed_errors(status: int, body: object, expected: type) -> None:
    error = error_from_envelope(status, body)
    assert type(error) is expected


class Echo(BaseModel):
    n: int


def _app() -> httpx2.AsyncClient:
    router = APIRouter()

    @router.post("/v1/echo")
    async def echo(body: Echo) -> Echo:
        if body.n < 0:
            raise NotFound(f"No thing {body.n}", {"n": body.n})
        if body.n == 13:
            raise RuntimeError("a bug")
        return body

    app = create_service_app("test", routers=[router], service_token=None)
    transport = httpx2.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx2.AsyncClient(transport=transport, base_url="http://t")


async def test_app_factory_errors_are_one_envelope() -> None:
    async with _app() as client:
        missing = await client.post("/v1/echo", json={"n": -1})
        assert missing.status_code == 404
        assert missing.json() == {
            "error": {"code": "not_found", "message": "No thing -1", "detail": {"n": -1}}
        }
        invalid = await client.post("/v1/echo", json={"n": "x"})
        assert invalid.status_code == 422
        assert invalid.json()["error"]["code"] == "invalid_input"
        assert "body.n" in invalid.json()["error"]["message"]
        unknown = await client.get("/v1/nowhere")
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
        bug = await client.post("/v1/echo", json={"n": 13})
        assert bug.status_code == 500 and bug.json()["error"]["code"] == "internal_error"


async def test_app_factory_health_metrics_and_request_ids() -> None:
    async with _app() as client:
        ok = await client.post("/v1/echo", json={"n": 1}, headers={"X-Request-ID": "abc"})
        assert ok.headers["x-request-id"] == "abc"
        assert (await client.get("/healthz")).headers["x-request-id"]
        assert (await client.get("/readyz")).json()["status"] == "ready"
        metrics = (await client.get("/metrics")).text
        assert (
            'loom_http_requests_total{method="POST",route="/v1/echo",service="test",'
            'status="200"} 1.0' in metrics
        )


async def test_operations_of_one_key_run_in_submission_order() -> None:
    queue = OperationQueue()
    seen: list[int] = []

    def work(i: int) -> int:
        time.sleep(0.01 * (3 - i))  # earlier ones are slower: order must still hold
        seen.append(i)
        return i

    ops = [queue.submit("model", "work", lambda i=i: work(i)) for i in range(3)]
    failing = queue.submit("model", "work", lambda: (_ for _ in ()).throw(Conflict("no")))
    results = [await queue.wait(op.id, timeout=5) for op in [*ops, failing]]
    assert seen == [0, 1, 2]
    assert [r.result for r in results[:3]] == [0, 1, 2]
    assert results[3].status == OperationStatus.failed
    assert results[3].error is not None and results[3].error.code == "conflict"
    with pytest.raises(NotFound):
        queue.get("op_unknown")
    queue.shutdown()
    await asyncio.sleep(0)


def test_busy_clock_counts_overlapping_work_once_and_the_period_in_progress() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from services.common.busy import BusyClock

    clock = BusyClock("loom_test_busy_seconds", "test")
    registry = CollectorRegistry()
    registry.register(clock)
    assert clock.seconds() == 0.0
    with clock.busy():
        with clock.busy():  # overlapping work: the resource is busy once, not twice
            time.sleep(0.05)
        during = clock.seconds()  # the period in progress is included
        time.sleep(0.05)
    after = clock.seconds()
    assert 0.05 <= during < after
    time.sleep(0.05)
    assert clock.seconds() == after  # idle time is not counted
    assert b"loom_test_busy_seconds_total" in generate_latest(registry)


def _dependency_calls(dependant: Dependant) -> list[Callable[..., object]]:
    found = []
    for sub in dependant.dependencies:
        if sub.call is not None:
            found.append(sub.call)
        found.extend(_dependency_calls(sub))
    return found


@pytest.mark.parametrize(
    ("app_factory", "path", "method"),
    [
        (create_gateway, "/v1/{service}/{path:path}", "POST"),
        (create_rollout, "/v1/sample", "POST"),
    ],
)
def test_hot_routes_have_only_async_dependencies(
    app_factory: Callable[[], FastAPI], path: str, method: str
) -> None:
    """FastAPI runs a plain `def` dependency in its thread pool: a thread hop per call. The
    routes every sample goes through must not pay one for reading app.state or the key."""
    route = next(
        r
        for r in app_factory().routes
        if isinstance(r, APIRoute) and r.path == path and method in r.methods
    )
    calls = _dependency_calls(route.dependant)
    assert calls, "the route should have dependencies to check"
    blocking = [call.__name__ for call in calls if not inspect.iscoroutinefunction(call)]
    assert blocking == []


def test_logging_leaves_out_the_http_clients_per_request_lines() -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level, logging.getLogger("httpx2").level
    try:
        configure_logging("gateway", "info")
        assert root.isEnabledFor(logging.INFO)
        assert not logging.getLogger("httpx2").isEnabledFor(logging.INFO)
        assert logging.getLogger("httpx2").isEnabledFor(logging.WARNING)
        configure_logging("gateway", "debug")
        assert logging.getLogger("httpx2").isEnabledFor(logging.DEBUG)
    finally:
        root.handlers[:], root.level = saved[0], saved[1]
        logging.getLogger("httpx2").setLevel(saved[2])
