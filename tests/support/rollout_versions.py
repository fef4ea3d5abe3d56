"""Small doubles of the rollout engine and of modelstate for `Versions` (no vLLM engine, no
server), shared by the unit tests of version resolution and of the hand-off."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

from modelstate.schemas import PendingVersion, Version, VersionKind
from services.common.errors import NotFound, Unavailable
from services.rollout.versions import Versions


class RecordingEngine:
    """Records the weight operations vLLM would perform."""

    # Python-only (no Rust backend): vLLM detokenizes; spans decode with `decode`.
    tokenizer = SimpleNamespace(
        decode=lambda token_ids, skip_special_tokens: "".join(map(str, token_ids))
    )

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.reload_delay = 0.0

    async def reload_weights(self, weights_path: str, label: str) -> None:
        self.calls.append(("reload", label))
        await asyncio.sleep(self.reload_delay)

    async def label_weights(self, label: str) -> None:
        self.calls.append(("label", label))

    async def add_lora(self, lora_request: object) -> None:
        self.calls.append(("add", lora_request.lora_name))  # type: ignore[attr-defined]

    async def remove_lora(self, lora_int_id: int) -> None:
        self.calls.append(("remove", lora_int_id))


class FakeStore:
    """Versions per job; `latest` is the highest number; unknown refs are NotFound."""

    def __init__(self) -> None:
        self.versions: dict[str, list[Version]] = {}
        self.lookups = 0
        self.down = False

    def publish(self, job_id: str, kind: VersionKind) -> Version:
        jobs = self.versions.setdefault(job_id, [])
        version = Version(
            id=sum(map(len, self.versions.values())) + 1,
            job_id=job_id,
            number=len(jobs) + 1,
            parent=None,
            step=None,
            kind=kind,
            base_model="loom/tiny",
            files=[],
            metrics={},
            aliases=["latest"],
            created_at=datetime.now(UTC),
            local_path=f"/v/{job_id}",
        )
        jobs.append(version)
        return version

    async def get_version(self, job_id: str, ref: int | str) -> Version:
        self.lookups += 1
        if self.down:
            raise Unavailable("modelstate is unreachable")
        jobs = self.versions.get(job_id, [])
        if ref == "latest" and jobs:
            return jobs[-1]
        if isinstance(ref, int) and 1 <= ref <= len(jobs):
            return jobs[ref - 1]
        raise NotFound(f"no version {ref!r} of {job_id!r}")

    async def subscribe_events(
        self, job_id: str | None = None, after: int = 0
    ) -> AsyncIterator[Version | PendingVersion]:
        raise Unavailable("modelstate is unreachable")
        yield  # pragma: no cover -- makes this an async generator


def live_stream(
    events: Sequence[Version | PendingVersion],
) -> Callable[..., AsyncIterator[Version | PendingVersion]]:
    """A `subscribe_events` that yields `events`, then stays silent, as a live stream."""

    async def subscribe_events(
        job_id: str | None = None, after: int = 0
    ) -> AsyncIterator[Version | PendingVersion]:
        for event in events:
            yield event
        await asyncio.Event().wait()

    return subscribe_events


async def follow_until(
    versions: Versions, engine: RecordingEngine, call: tuple[str, object]
) -> None:
    """Run the publication follower until the engine has been asked for `call`."""
    task = asyncio.create_task(versions.follow_publications())
    for _ in range(100):
        if call in engine.calls:
            break
        await asyncio.sleep(0.01)
    task.cancel()


async def materialize(version: Version) -> Path:
    return Path(f"/v/{version.job_id}/{version.number}")


def make_versions(max_loras: int = 2) -> tuple[Versions, RecordingEngine, FakeStore]:
    engine, store = RecordingEngine(), FakeStore()
    versions = Versions(
        engine, store, materialize, base_model="loom/tiny", base_path="/base", max_loras=max_loras
    )
    return versions, engine, store
