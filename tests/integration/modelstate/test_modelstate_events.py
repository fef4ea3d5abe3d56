"""Version notifications over a real socket: uvicorn in a thread, the real client's SSE
consumer, restarts of the client and of the server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2
import pytest

from modelstate.app import create_app
from modelstate.client import ModelStateClient
from modelstate.schemas import PendingVersion, Version, VersionKind, VersionMeta
from modelstate.settings import ModelStateSettings
from services.common.ports import free_port
from services.common.service_token import service_headers
from tests.support.servers import serve_in_thread

RECEIVE_TIMEOUT_S = 20.0


@contextmanager
def running_server(settings: ModelStateSettings) -> Iterator[str]:
    with serve_in_thread(create_app(settings), settings.bind_of("modelstate")[1]) as url:
        yield url


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> ModelStateSettings:
    return ModelStateSettings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        modelstate_url=f"http://127.0.0.1:{free_port()}",
        modelstate_sse_heartbeat_s=0.5,
    )


@pytest.fixture
async def client(settings: ModelStateSettings) -> AsyncIterator[ModelStateClient]:
    client = ModelStateClient.from_settings(settings, event_read_timeout_s=3.0)
    yield client
    await client.aclose()


class Subscription:
    """Runs `client.subscribe` (or, with `pending`, `subscribe_events`) in a task and collects
    what it yields."""

    def __init__(
        self, client: ModelStateClient, job_id: str | None, after: int, pending: bool = False
    ) -> None:
        self.received: asyncio.Queue[Version | PendingVersion] = asyncio.Queue()
        events = client.subscribe_events if pending else client.subscribe
        self.task = asyncio.create_task(self._run(events(job_id, after=after)))

    async def _run(self, events: AsyncIterator[Version | PendingVersion]) -> None:
        async for event in events:
            await self.received.put(event)

    async def next(self) -> Version | PendingVersion:
        return await asyncio.wait_for(self.received.get(), RECEIVE_TIMEOUT_S)

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def publish(client: ModelStateClient, directory: Path, job_id: str, step: int) -> Version:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_model.safetensors").write_bytes(f"{job_id}-{step}".encode())
    meta = VersionMeta(job_id=job_id, kind=VersionKind.lora, base_model="loom/tiny", step=step)
    return await client.publish(meta, directory)


async def test_subscribe_receives_live_versions_and_resumes_after_disconnect(
    settings: ModelStateSettings, client: ModelStateClient, tmp_path: Path
) -> None:
    with running_server(settings):
        subscription = Subscription(client, "job-a", after=0)
        await asyncio.sleep(0.5)  # connected and past the (empty) replay: this one comes live
        first = await publish(client, tmp_path / "a", "job-a", 1)
        await publish(client, tmp_path / "b", "job-b", 1)  # another job: filtered out
        assert await subscription.next() == first
        await subscription.stop()

        second = await publish(client, tmp_path / "a", "job-a", 2)
        third = await publish(client, tmp_path / "a", "job-a", 3)
        resumed = Subscription(client, "job-a", after=first.id)
        # Replayed from the database: same versions (aliases as they stand now).
        assert [(await resumed.next()).id, (await resumed.next()).id] == [second.id, third.id]
        await asyncio.sleep(1.5)  # heartbeats only; nothing else arrives
        assert resumed.received.empty()
        await resumed.stop()

        everything = Subscription(client, None, after=0)
        assert [(await everything.next()).job_id for _ in range(4)] == [
            "job-a",
            "job-b",
            "job-a",
            "job-a",
        ]
        await everything.stop()


async def test_subscription_survives_a_server_restart(
    settings: ModelStateSettings, client: ModelStateClient, tmp_path: Path
) -> None:
    with running_server(settings):
        subscription = Subscription(client, "job-a", after=0)
        first = await publish(client, tmp_path / "a", "job-a", 1)
        assert await subscription.next() == first

    # Down: the subscriber retries with backoff. A new process then serves the same state.
    await asyncio.sleep(1.0)
    with running_server(settings):
        second = await publish(client, tmp_path / "a", "job-a", 2)
        assert await subscription.next() == second
        await subscription.stop()


async def test_events_endpoint_speaks_server_sent_events(
    settings: ModelStateSettings, client: ModelStateClient, tmp_path: Path
) -> None:
    with running_server(settings):
        version = await publish(client, tmp_path / "a", "job-a", 1)
        lines: list[str] = []
        async with (
            httpx2.AsyncClient(
                base_url=settings.modelstate_url, headers=service_headers(settings)
            ) as http,
            http.stream("GET", "/v1/events", headers={"Last-Event-ID": "0"}) as response,
        ):
            assert response.headers["content-type"].startswith("text/event-stream")
            # Read until the replayed version and a heartbeat have both come: on a busy
            # machine the first heartbeat (every 0.5 s here) may precede the replay.
            async with asyncio.timeout(30):
                async for line in response.aiter_lines():
                    lines.append(line)
                    if any(x.startswith(": ping") for x in lines) and any(
                        x.startswith("data: ") for x in lines
                    ):
                        break
        assert f"id: {version.id}" in lines and "event: version" in lines
        data = next(line for line in lines if line.startswith("data: "))
        assert Version.model_validate_json(data.removeprefix("data: ")) == version


async def test_a_staged_publish_is_announced_pending_with_files_readable_at_once(
    settings: ModelStateSettings, client: ModelStateClient
) -> None:
    """Before the store verifies a staged publish, subscribers on its host hear of it with a
    directory of the same files (same inodes); its version follows and serves those files."""
    with running_server(settings):
        subscription = Subscription(client, "job-a", after=0, pending=True)
        await asyncio.sleep(0.5)  # connected: pending events are live only
        staging = await client.staging_dir()
        assert staging is not None
        (staging / "model.safetensors").write_bytes(b"weights" * 1000)
        (staging / "config.json").write_text("{}")
        meta = VersionMeta(job_id="job-a", kind=VersionKind.full, base_model="loom/tiny")
        version = await client.publish(meta, staging)
        pending, announced = await subscription.next(), await subscription.next()
        await subscription.stop()
    assert isinstance(pending, PendingVersion) and announced == version
    assert (pending.job_id, pending.kind, pending.staged) == (
        "job-a",
        VersionKind.full,
        staging.name,
    )
    assert pending.files == {"config.json": 2, "model.safetensors": 7000}
    assert version.local_path is not None
    for name in pending.files:
        early, final = Path(pending.local_path) / name, Path(version.local_path) / name
        assert early.read_bytes() == final.read_bytes()
        assert early.stat().st_ino == final.stat().st_ino
