"""Stateful sandbox sessions for multi-turn tools: one agent each, whose workdir keeps its
files between programs (processes never outlive a program). Limits: sessions in all and per
job; a session idle for `sandbox_session_idle_s` is closed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, field

from services.common.errors import LimitExceeded, NotFound
from services.sandbox.agent_pool import Agent, AgentBackend
from services.sandbox.schemas import (
    ExecuteRequest,
    ExecuteResponse,
    FileIn,
    FileOut,
    SessionInfo,
)
from services.sandbox.settings import SandboxSettings

log = logging.getLogger(__name__)


@dataclass
class Session:
    id: str
    job_id: str | None
    number: int  # which of the sandbox_max_sessions session slots it holds
    agent: Agent
    created_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one program at a time

    def info(self, idle_timeout_s: float) -> SessionInfo:
        return SessionInfo(
            id=self.id,
            job_id=self.job_id,
            created_at=self.created_at,
            idle_timeout_s=idle_timeout_s,
            idle_s=round(time.monotonic() - self.last_used, 3),
        )


class SessionManager:
    def __init__(self, backend: AgentBackend, settings: SandboxSettings) -> None:
        self.backend = backend
        self.settings = settings
        self._sessions: dict[str, Session] = {}
        self._free_numbers = list(range(settings.sandbox_max_sessions))
        self._reaper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._reaper = asyncio.get_running_loop().create_task(self._close_idle_sessions())

    async def create(self, job_id: str | None, image: str | None = None) -> SessionInfo:
        if job_id is not None:
            held = sum(s.job_id == job_id for s in self._sessions.values())
            if held >= self.settings.sandbox_max_sessions_per_job:
                raise LimitExceeded(
                    f"job {job_id} already has {held} open sandbox sessions (the limit per job);"
                    " close one first",
                    {"limit": self.settings.sandbox_max_sessions_per_job},
                )
        if not self._free_numbers:
            raise LimitExceeded(
                f"all {self.settings.sandbox_max_sessions} sandbox sessions are "
                "in use; close one or try later"
            )
        number = self._free_numbers.pop()
        try:
            agent = await self.backend.open_session(number, image)
        except BaseException:
            self._free_numbers.append(number)
            raise
        session = Session(id=f"sbx_{uuid.uuid4().hex}", job_id=job_id, number=number, agent=agent)
        self._sessions[session.id] = session
        return session.info(self.settings.sandbox_session_idle_s)

    def get(self, session_id: str) -> SessionInfo:
        return self._session(session_id).info(self.settings.sandbox_session_idle_s)

    async def execute(self, session_id: str, request: ExecuteRequest) -> ExecuteResponse:
        session = self._session(session_id)
        async with session.lock:
            outcome = await self.backend.run_in_session(session.agent, request)
            session.last_used = time.monotonic()
        if outcome.lost:
            log.warning("sandbox session %s lost its sandbox; closing it", session_id)
            await self.close(session_id)
        return outcome.response

    async def write_files(self, session_id: str, files: list[FileIn]) -> None:
        await self.execute(session_id, ExecuteRequest(code="pass", files=files))

    async def read_files(self, session_id: str, paths: list[str]) -> list[FileOut]:
        return (await self.execute(session_id, ExecuteRequest(code="pass", collect=paths))).files

    async def close(self, session_id: str) -> None:
        session = self._session(session_id)
        del self._sessions[session_id]
        async with session.lock:
            await self.backend.close_session(session.agent)
        self._free_numbers.append(session.number)

    async def aclose(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for session_id in list(self._sessions):
            await self.close(session_id)

    def _session(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise NotFound(
                f"no sandbox session {session_id!r}: it never existed, was closed, "
                "was idle too long or lost its sandbox"
            )
        return session

    async def _close_idle_sessions(self) -> None:
        idle_s = self.settings.sandbox_session_idle_s
        while True:
            await asyncio.sleep(min(idle_s / 4, 5.0))
            now = time.monotonic()
            for session in list(self._sessions.values()):
                if not session.lock.locked() and now - session.last_used > idle_s:
                    log.info("closing sandbox session %s: idle for %.0f s", session.id, idle_s)
                    with contextlib.suppress(NotFound):
                        await self.close(session.id)
