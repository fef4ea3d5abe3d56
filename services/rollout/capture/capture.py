"""The capture service: trajectories created, read and deleted, and a `Recording` for each
OpenAI call made inside one (its prompt built from the calls it continues, its completions
recorded before the agent is answered)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool

from services.rollout.capture.segments import chat_parent, continued_prompt, segments, token_parent
from services.rollout.capture.store import NewCall, StoredCall, TrajectoryStore
from services.rollout.chat_format import ChatFormat, Message
from services.rollout.schemas import (
    CapturedTrajectory,
    TrajectoryCreate,
    TrajectoryInfo,
    VersionRef,
)
from services.rollout.versions import Versions


class Capture:
    def __init__(self, store: TrajectoryStore, versions: Versions) -> None:
        self.store = store
        self.versions = versions

    async def create(self, request: TrajectoryCreate) -> TrajectoryInfo:
        await self.versions.resolve(request.job_id, request.version)  # a bad version fails now
        return await run_in_threadpool(self.store.create, request)

    async def get(
        self, trajectory_id: str, decode: Callable[[list[int]], str]
    ) -> CapturedTrajectory:
        info = await run_in_threadpool(self.store.info, trajectory_id)
        calls = await run_in_threadpool(self.store.calls, trajectory_id)
        return CapturedTrajectory(
            trajectory=info, calls=[c.public() for c in calls], segments=segments(calls, decode)
        )

    async def delete(self, trajectory_id: str) -> None:
        await run_in_threadpool(self.store.delete, trajectory_id)

    async def open(self, trajectory_id: str) -> Recording:
        info = await run_in_threadpool(self.store.info, trajectory_id)
        calls = await run_in_threadpool(self.store.calls, trajectory_id)
        return Recording(self.store, info, calls)


class Recording:
    """One OpenAI call inside a trajectory."""

    def __init__(
        self, store: TrajectoryStore, info: TrajectoryInfo, calls: list[StoredCall]
    ) -> None:
        self.store = store
        self.info = info
        self.calls = calls

    @property
    def ref(self) -> tuple[str | None, VersionRef]:
        """The trajectory decides the version: an agent keeps whatever model name it has."""
        return self.info.job_id, self.info.version

    def chat_prompt(
        self, chat: ChatFormat, messages: list[Message], tools: list[dict[str, Any]] | None
    ) -> tuple[list[int], int | None]:
        """The prompt's tokens and the call it continues (None: rendered afresh)."""
        parent = chat_parent(self.calls, messages, tools)
        if parent is None:
            return chat.prompt_ids(messages, tools), None
        return continued_prompt(chat, parent, messages, tools), parent.index

    def token_parent(self, prompt: list[int]) -> int | None:
        parent = token_parent(self.calls, prompt)
        return None if parent is None else parent.index

    async def record(self, calls: list[NewCall]) -> list[int]:
        return await run_in_threadpool(self.store.add, self.info.id, calls)
