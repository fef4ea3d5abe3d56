"""The proxy, through real uvicorn servers: paths, query strings, headers, bodies, streams."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import httpx2

from services.common.service_token import client_of
from services.reward.client import RewardClient

if TYPE_CHECKING:
    from tests.integration.gateway.conftest import Stack


async def test_forwards_method_path_query_headers_and_body(stack: Stack) -> None:
    async with stack.client() as client:
        response = await client.post(
            "/v1/reward/echo/jobs/j/versions?wait=5&tag=a%2Fb",
            content=b'{"x": 1}',
            headers={
                "Content-Type": "application/json",
                "X-Request-ID": "req-proxy",
                "X-Custom": "kept",
                "Connection": "keep-alive, X-Secret-Hop",
                "X-Secret-Hop": "dropped",
            },
        )
    assert response.status_code == 200, response.text
    echoed = response.json()
    assert echoed["method"] == "POST"
    assert echoed["path"] == "/v1/echo/jobs/j/versions"
    assert echoed["query"] == "wait=5&tag=a%2Fb"
    assert echoed["body"] == '{"x": 1}'
    headers = echoed["headers"]
    assert headers["x-request-id"] == "req-proxy"
    assert headers["x-custom"] == "kept"
    assert "authorization" not in headers and "x-secret-hop" not in headers
    assert headers["host"] != stack.url.removeprefix("http://")
    assert response.headers.get_list("x-request-id") == ["req-proxy"]


async def test_streams_sse_without_buffering(stack: Stack) -> None:
    async with (
        asyncio.timeout(20),
        stack.client() as client,
        client.stream("GET", "/v1/reward/events") as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks = response.aiter_raw()
        # The upstream holds the second event until we have seen the first: a buffering proxy
        # would hang here.
        first = await asyncio.wait_for(anext(chunks), timeout=10)
        assert first == b"data: first\n\n"
        stack.gate.opened.set()
        rest = b"".join([chunk async for chunk in chunks])
    assert rest == b"data: second\n\n"


async def test_large_body_round_trip(stack: Stack) -> None:
    payload = b"x" * (8 * 1024 * 1024)
    async with stack.client() as client:
        response = await client.put("/v1/reward/echo/blob", content=payload)
    assert response.status_code == 200
    assert len(response.json()["body"]) == len(payload)


async def test_unreachable_upstream_is_503_naming_it(stack: Stack) -> None:
    async with stack.client() as client:
        response = await client.post("/v1/rollout/sample", json={"prompt": "1+1="})
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "unavailable" and "rollout" in error["message"]
    assert error["detail"] == {"service": "rollout"}


async def test_unknown_service_is_404_listing_known_ones(stack: Stack) -> None:
    async with stack.client() as client:
        response = await client.get("/v1/nosuch/thing")
    assert response.status_code == 404
    assert response.json()["error"]["detail"]["known_services"] == [
        "rollout",
        "reward",
        "sandbox",
        "trainer",
        "modelstate",
    ]


async def test_upstream_errors_pass_through(stack: Stack) -> None:
    async with stack.client() as client:
        missing = await client.get("/v1/reward/not-a-route")
        wrong_method = await client.patch("/v1/reward/echo/x")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert wrong_method.status_code == 405


async def test_stack_health_reports_unreachable_services(stack: Stack) -> None:
    async with stack.client() as client:
        response = await client.get("/v1/health")
    assert response.status_code == 200
    health = response.json()
    assert health["status"] == "degraded"
    services = health["services"]
    assert services["gateway"]["status"] == "ready"
    assert services["reward"]["status"] == "ready"
    assert services["trainer"]["status"] == "ready"
    for name in ("rollout", "sandbox", "modelstate"):
        assert services[name]["status"] == "unreachable"


async def test_metrics_and_readiness_are_public(stack: Stack) -> None:
    async with httpx2.AsyncClient(base_url=stack.url) as anonymous:
        ready = await anonymous.get("/readyz")
        assert ready.json()["detail"] == {"database": "ok"}
        assert "loom_http_requests" in (await anonymous.get("/metrics")).text


BURST = 64  # samples an RL step sends at once


async def burst_ports(send: Callable[[], Awaitable[httpx2.Response]]) -> set[int]:
    """The client ports the echo service saw in one burst of concurrent requests."""
    responses = await asyncio.gather(*(send() for _ in range(BURST)))
    assert all(r.status_code == 200 for r in responses)
    return {r.json()["client_port"] for r in responses}


def assert_reused(first: set[int], second: set[int]) -> None:
    """The second burst opened a connection only once every one kept from the first was busy.

    It may need more connections than the first (a warm burst is more concurrent), so it is not
    a subset; but a keep-alive limit under the burst size would close some of the first's and
    reopen them, leaving them unused while new ones open."""
    assert len(first) > BURST // 2  # the burst really was concurrent
    opened = second - first
    assert not opened or first <= second, (
        f"{len(opened)} new connections while {len(first - second)} kept ones went unused"
    )


async def test_the_gateway_reuses_its_upstream_connections_across_bursts(stack: Stack) -> None:
    """Every pooled connection stays open between bursts (a keep-alive limit under the burst
    size would reopen the rest each time)."""
    async with stack.client() as client:
        first = await burst_ports(lambda: client.get("/v1/reward/echo/a"))
        second = await burst_ports(lambda: client.get("/v1/reward/echo/b"))
    assert_reused(first, second)


async def test_service_clients_reuse_their_connections_across_bursts(stack: Stack) -> None:
    """The same for `ServiceClient` (the SDK's and the services' client)."""
    client = client_of(stack.settings, RewardClient)
    try:
        first = await burst_ports(lambda: client.request("GET", "/v1/echo/a"))
        second = await burst_ports(lambda: client.request("GET", "/v1/echo/b"))
    finally:
        await client.aclose()
    assert_reused(first, second)
