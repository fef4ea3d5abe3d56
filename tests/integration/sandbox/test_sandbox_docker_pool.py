"""The docker backend's warm pool at start-up and teardown, against the real Docker daemon
(issue 39): a large pool starts every time, a slot that fails to start costs that slot and not
the service, the first real failure is the one reported, and teardown waits for starts under
way before it closes the Docker client."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import docker.errors
import httpx2
import pytest

from services.common.service_token import service_headers
from services.sandbox import agent_pool
from services.sandbox.app import create_app
from services.sandbox.docker_backend import ContainerAgent, DockerBackend
from services.sandbox.schemas import ExecuteRequest, ExecutionStatus
from services.sandbox.settings import SandboxSettings
from tests.support.sandboxes import docker_pool, sandbox_settings

MISSING_IMAGE = "loom-sandbox:loom-test-missing"


class HookedBackend(DockerBackend):
    """Container starts that fail a given number of times per slot, or wait for `gate`."""

    def __init__(self, settings: SandboxSettings, failures: dict[int, int]) -> None:
        super().__init__(settings)
        self.failures = failures
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()  # a start is held at the gate

    def _start_agent(self, slot: int, image: str | None) -> ContainerAgent:
        if not self.gate.is_set():
            self.waiting.set()
            self.gate.wait()
        if self.failures.get(slot, 0) > 0:
            self.failures[slot] -= 1
            raise docker.errors.APIError(f"injected failure of slot {slot}")
        return super()._start_agent(slot, image)


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_pool, "RETRY_S", 0.05)


@asynccontextmanager
async def serving(settings: SandboxSettings) -> AsyncIterator[httpx2.AsyncClient]:
    """The service's app through its start-up and shut-down, and a client of it."""
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app),
            base_url="http://sandbox",
            headers=service_headers(settings),
        ) as client,
    ):
        yield client


async def test_a_pool_of_32_starts_and_stops_ten_times_in_a_row(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = sandbox_settings("docker", sandbox_max_concurrency=32)
    image = settings.sandbox_docker_image
    for _ in range(10):
        async with serving(settings) as client:
            ready = await client.get("/readyz")
            assert ready.status_code == 200
            detail = ready.json()["detail"]
            assert detail["warm"] == {image: 32} and detail["start_errors"] == {}
            responses = await asyncio.gather(
                *(client.post("/v1/execute", json={"code": f"print({n} * 2)"}) for n in range(32))
            )
            assert [r.json()["stdout"] for r in responses] == [f"{n * 2}\n" for n in range(32)]
        assert docker_pool(settings) == []
    # docker's client held 10 connections; 32 threads sharing it discarded the rest.
    assert "Connection pool is full" not in caplog.text


async def test_an_image_that_cannot_start_costs_its_own_pool_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = sandbox_settings(
        "docker", sandbox_max_concurrency=2, sandbox_docker_images=[MISSING_IMAGE]
    )
    async with serving(settings) as client:
        ready = await client.get("/readyz")
        assert ready.status_code == 200
        detail = ready.json()["detail"]
        assert detail["warm"] == {settings.sandbox_docker_image: 2, MISSING_IMAGE: 0}
        assert list(detail["start_errors"]) == [MISSING_IMAGE]
        assert "No such image" in detail["start_errors"][MISSING_IMAGE]
        served = await client.post("/v1/execute", json={"code": "print(1)"})
        assert served.json()["stdout"] == "1\n"
        refused = await client.post(
            "/v1/execute", json={"code": "print(1)", "image": MISSING_IMAGE}
        )
        assert refused.status_code == 503
        assert "No such image" in refused.json()["error"]["message"]
    assert "No such image" in caplog.text
    assert docker_pool(settings) == []


async def test_failed_starts_are_retried_then_refilled_in_the_background() -> None:
    # Slot 1 starts on its second try; slot 2 fails until the test lets it start.
    backend = HookedBackend(
        sandbox_settings("docker", sandbox_max_concurrency=3), failures={1: 1, 2: 1_000_000}
    )
    await backend.start()
    try:
        image = backend.settings.sandbox_docker_image
        described = backend.describe()
        assert described["warm"] == {image: 2}
        # The first failure since the pool was last full: slot 1's or slot 2's.
        assert described["start_errors"][image] in {
            "injected failure of slot 1",
            "injected failure of slot 2",
        }
        result = await backend.execute(ExecuteRequest(code="print('served')"))
        assert result.status is ExecutionStatus.ok and result.stdout == "served\n"
        backend.failures[2] = 0  # as if the cause were fixed: the background refill starts it
        async with asyncio.timeout(60):  # a bound on a hang, not on speed
            while backend.describe()["warm"] != {image: 3}:
                await asyncio.sleep(0.05)
        assert backend.describe()["start_errors"] == {}
        assert len(docker_pool(backend.settings)) == 3
    finally:
        await backend.aclose()
    assert docker_pool(backend.settings) == []


async def test_a_pool_that_cannot_start_at_all_reports_the_first_real_failure() -> None:
    backend = HookedBackend(
        sandbox_settings("docker", sandbox_max_concurrency=2), failures={0: 100, 1: 100}
    )
    with pytest.raises(RuntimeError, match="injected failure of slot") as raised:
        await backend.start()
    assert isinstance(raised.value.__cause__, docker.errors.APIError)
    assert docker_pool(backend.settings) == []


async def test_teardown_waits_for_a_start_under_way(caplog: pytest.LogCaptureFixture) -> None:
    backend = HookedBackend(sandbox_settings("docker", sandbox_max_concurrency=1), failures={})
    await backend.start()
    backend.gate.clear()
    opening = asyncio.ensure_future(backend.open_session(0, None))
    await asyncio.to_thread(backend.waiting.wait)
    closing = asyncio.ensure_future(backend.aclose())
    opening.cancel()  # as the lifespan's end would: the start itself runs on in its thread
    await asyncio.sleep(0.2)
    assert not closing.done()  # held until the start ends: the client it uses stays open
    backend.gate.set()
    await closing
    # The container started after teardown began was removed too, without an error.
    assert docker_pool(backend.settings) == []
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
