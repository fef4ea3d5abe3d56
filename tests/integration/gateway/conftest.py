"""Fixtures for the gateway's integration tests: real uvicorn servers in threads (the gateway,
and the services behind it), on free ports, over real databases."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import StreamingResponse

from gateway.app import create_app
from gateway.settings import GatewaySettings
from services.common.app_factory import create_service_app
from services.common.ports import free_port
from services.common.service_token import service_token
from tests.support.servers import serve_in_thread
from tests.support.trainer import trainer_stand_in


@pytest.fixture
def serve() -> Serve:
    """`with serve(app) as url:` runs the app under uvicorn in a thread."""
    return serve_in_thread


Serve = Callable[[FastAPI], AbstractContextManager[str]]


class StreamGate:
    """Holds an SSE stream after its first event until the test opens the gate: if the
    gateway buffered responses, the test would never see that first event."""

    def __init__(self) -> None:
        self.opened = threading.Event()


def echo_service(gate: StreamGate, token: str) -> FastAPI:
    """A small Loom-shaped service that asks for the service `token`: echoes what reached it
    and streams server-sent events."""
    router = APIRouter(prefix="/v1")

    @router.api_route("/echo/{rest:path}", methods=["GET", "POST", "PUT", "DELETE"])
    async def echo(rest: str, request: Request) -> dict[str, object]:
        body = await request.body()
        return {
            "method": request.method,
            "path": request.url.path,
            "query": request.url.query,
            "headers": dict(request.headers),
            "body": body.decode("utf-8", "replace"),
            "client_port": request.client.port if request.client else None,
        }

    @router.get("/events")
    async def events() -> StreamingResponse:
        async def stream() -> AsyncIterator[bytes]:
            yield b"data: first\n\n"
            while not gate.opened.is_set():
                await asyncio.sleep(0.01)
            yield b"data: second\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return create_service_app("reward", routers=[router], service_token=token)


@dataclass
class Stack:
    url: str
    admin_key: str
    settings: GatewaySettings
    gate: StreamGate
    trainer: FastAPI

    def client(self, key: str | None = None) -> httpx2.AsyncClient:
        headers = {"Authorization": f"Bearer {key or self.admin_key}"}
        return httpx2.AsyncClient(base_url=self.url, headers=headers, timeout=30)


@pytest.fixture
def gateway_settings(tmp_path: Path, database_url: str) -> GatewaySettings:
    return GatewaySettings(data_dir=tmp_path / "data", database_url=database_url)


@pytest.fixture
def stack(gateway_settings: GatewaySettings) -> Iterator[Stack]:
    """The gateway in front of an echo service (as reward), a trainer stand-in, and nothing
    listening for the other services."""
    gate = StreamGate()
    # Both stand-ins ask for the service token, as the real services do: every call the
    # gateway makes (proxied, admin pages, SDK-compatible APIs) must carry it.
    token = service_token(gateway_settings)
    trainer = trainer_stand_in(token)
    with (
        serve_in_thread(echo_service(gate, token)) as echo_url,
        serve_in_thread(trainer) as trainer_url,
    ):
        unreachable = f"http://127.0.0.1:{free_port()}"
        settings = gateway_settings.model_copy(
            update={
                "reward_url": echo_url,
                "trainer_url": trainer_url,
                "rollout_url": unreachable,
                "sandbox_url": unreachable,
                "modelstate_url": unreachable,
            }
        )
        with serve_in_thread(create_app(settings)) as url:
            admin_key = settings.admin_key_file.read_text().strip()
            try:
                yield Stack(
                    url=url, admin_key=admin_key, settings=settings, gate=gate, trainer=trainer
                )
            finally:
                gate.opened.set()  # never leave a stream hanging into the server's shutdown
