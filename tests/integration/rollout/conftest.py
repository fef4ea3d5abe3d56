"""The rollout service over one real vLLM engine (the tiny model on CPU), shared by the
package's test modules: starting it is most of their time."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
import psutil
import pytest
from fastapi import FastAPI

from modelstate.app import create_app as create_modelstate_app
from modelstate.client import ModelStateClient
from modelstate.settings import ModelStateSettings
from services.common.ports import free_port
from services.common.service_token import service_headers
from services.common.settings import LoomSettings
from services.rollout.app import create_app
from services.rollout.settings import RolloutSettings
from tests.support.servers import serve_in_thread

PROMPT = [5, 6, 7, 8, 9]
TIMINGS: dict[str, float] = {}


def vllm_children(ignore: frozenset[int] = frozenset()) -> list[str]:
    """Engine-like descendants of this test process, except those in `ignore` (processes
    that predate the engine, e.g. a stack another test module started)."""
    names = []
    for child in psutil.Process().children(recursive=True):
        if child.pid in ignore:
            continue
        try:
            names.append(" ".join(child.cmdline()) or child.name())
        except psutil.Error:
            continue
    return [n for n in names if "spawn_main" in n or "EngineCore" in n]


@pytest.fixture(scope="package")
def modelstate_port() -> int:
    return free_port()


@pytest.fixture(scope="package")
async def rollout(
    tiny_model_dir: Path, modelstate_port: int, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[httpx2.AsyncClient]:
    settings = RolloutSettings(
        data_dir=tmp_path_factory.mktemp("rollout"),
        rollout_model=str(tiny_model_dir),
        modelstate_url=f"http://127.0.0.1:{modelstate_port}",
    )
    async with serve_rollout(create_app(settings), settings) as client:
        yield client
    print("\nrollout timings:", json.dumps({k: round(v, 3) for k, v in TIMINGS.items()}))


@asynccontextmanager
async def serve_rollout(
    app: FastAPI, settings: RolloutSettings
) -> AsyncIterator[httpx2.AsyncClient]:
    """A client of the rollout app (built with `settings`) once its engine is ready;
    afterwards, no engine process may be left."""
    earlier = frozenset(child.pid for child in psutil.Process().children(recursive=True))
    started = time.perf_counter()
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app),
            base_url="http://rollout",
            timeout=120,
            headers=service_headers(settings),
        ) as client,
    ):
        assert (await client.get("/healthz")).status_code == 200  # at once, while starting
        assert (await client.get("/readyz")).status_code == 503
        while (ready := await client.get("/readyz")).status_code != 200:
            assert time.perf_counter() - started < 300, ready.text
            assert "failed" not in ready.text, ready.text
            await asyncio.sleep(0.5)
        TIMINGS["ready_s"] = time.perf_counter() - started
        TIMINGS.update(
            {f"engine_{k}": v for k, v in ready.json()["detail"].items() if k.endswith("_s")}
        )
        yield client
    # vLLM's EngineCore and Worker are spawned processes (Python's resource tracker may stay).
    leftovers = vllm_children(ignore=earlier)
    assert not leftovers, f"engine processes left after shutdown: {leftovers}"


@pytest.fixture(scope="package")
def modelstate(
    rollout: httpx2.AsyncClient, modelstate_port: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """Started after rollout is ready (rollout's follower has been retrying meanwhile)."""
    data_dir = tmp_path_factory.mktemp("modelstate")
    app = create_modelstate_app(ModelStateSettings(data_dir=data_dir))
    with serve_in_thread(app, modelstate_port) as url:
        yield url


@pytest.fixture
async def store(modelstate: str) -> AsyncIterator[ModelStateClient]:
    client = ModelStateClient.from_settings(LoomSettings(modelstate_url=modelstate))
    yield client
    await client.aclose()
