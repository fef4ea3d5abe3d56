"""Notification of published versions: an in-process broadcast and its SSE endpoint.

A subscriber first registers for live versions, then replays from the database every version
after its cursor (`after` or the `Last-Event-ID` header), then streams live ones, skipping what
the replay already sent. So a client that reconnects with the last id it saw misses nothing,
whichever side restarted. Comment heartbeats let both ends notice a dead connection.

Live streams also carry `pending` events (`PendingVersion`, no id, never replayed): a staged
publish has started, so an engine on the store's host may start reading its files while the
store verifies them. Clients that do not know the event skip it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool

from modelstate.deps import SettingsDep, StoreDep
from modelstate.schemas import PendingVersion, Version
from modelstate.store import ModelStore
from services.common.deps import app_state
from services.common.schemas import RESOURCE_ID_PATTERN

REPLAY_BATCH = 500
JOB_ID_PATTERN = RESOURCE_ID_PATTERN


Announcement = Version | PendingVersion


class VersionBroadcaster:
    """Fans each newly committed version (and each pending one) out to the open event streams
    of this process."""

    def __init__(self) -> None:
        self._queues: set[asyncio.Queue[Announcement]] = set()

    def announce(self, version: Announcement) -> None:
        """Call from the event loop: a Version after its transaction has committed."""
        for queue in self._queues:
            queue.put_nowait(version)

    @contextmanager
    def listen(self) -> Iterator[asyncio.Queue[Announcement]]:
        queue: asyncio.Queue[Announcement] = asyncio.Queue()
        self._queues.add(queue)
        try:
            yield queue
        finally:
            self._queues.discard(queue)


EventsDep = Annotated[VersionBroadcaster, Depends(app_state("events"))]


def version_event(version: Version) -> ServerSentEvent:
    return ServerSentEvent(data=version.model_dump_json(), event="version", id=str(version.id))


async def version_events(
    store: ModelStore, broadcaster: VersionBroadcaster, *, job_id: str | None, after: int
) -> AsyncIterator[ServerSentEvent]:
    with broadcaster.listen() as live:
        yield ServerSentEvent(retry=1000)  # how soon a browser EventSource reconnects
        replayed: set[int] = set()
        cursor = after
        while True:
            batch = await run_in_threadpool(store.versions_after, cursor, job_id, REPLAY_BATCH)
            for version in batch:
                replayed.add(version.id)
                yield version_event(version)
            if len(batch) < REPLAY_BATCH:
                break
            cursor = batch[-1].id
        while True:
            version = await live.get()
            if job_id is not None and version.job_id != job_id:
                continue
            if isinstance(version, PendingVersion):
                yield ServerSentEvent(data=version.model_dump_json(), event="pending")
            elif version.id > after and version.id not in replayed:
                yield version_event(version)


router = APIRouter(prefix="/v1", tags=["events"])


@router.get(
    "/events",
    response_class=EventSourceResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "`event: version` messages (`id`: the version id) and "
            "`event: pending` messages (live only, no id).",
        }
    },
)
async def stream_events(
    store: StoreDep,
    broadcaster: EventsDep,
    settings: SettingsDep,
    job_id: Annotated[
        str | None, Query(min_length=1, max_length=128, pattern=JOB_ID_PATTERN)
    ] = None,
    after: Annotated[int, Query(ge=0, description="Replay versions with a larger id.")] = 0,
    last_event_id: Annotated[int | None, Header(ge=0)] = None,
) -> EventSourceResponse:
    events = version_events(store, broadcaster, job_id=job_id, after=max(after, last_event_id or 0))
    # Comment pings let both ends notice a dead connection; sse-starlette also ends open
    # streams when uvicorn begins shutting down, so a restart is not held up by subscribers.
    return EventSourceResponse(events, ping=settings.modelstate_sse_heartbeat_s)
