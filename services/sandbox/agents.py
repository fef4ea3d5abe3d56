"""What both backends share: a pool of sandbox agents (`agent.py`), one program per agent at a
time, and the translation between execute requests and the agent's protocol.

A backend says how to start an agent (a local child process, or a container) by subclassing
`AgentBackend`; the pool hands agents out, puts them back after a clean run, and replaces in the
background any agent that died, failed its clean-up or served `max_uses` programs. The blocking
I/O with agents runs on a thread pool sized to the pool.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import logging
import time
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.common.errors import InvalidInput, Unavailable
from services.sandbox.outcome import classify, rlimits
from services.sandbox.schemas import ExecuteRequest, ExecuteResponse, ExecutionStatus, FileOut
from services.sandbox.settings import SandboxSettings

log = logging.getLogger(__name__)

AGENT_PATH = Path(__file__).with_name("agent.py")
LAUNCHER_PATH = Path(__file__).with_name("launcher.py")
PROBE_CODE = "import sys; print('%d.%d.%d' % sys.version_info[:3])"
# Beyond a program's own timeout: the agent's pipe drain and clean-up.
AGENT_GRACE_S = 5.0
REPLACE_RETRY_S = 1.0
CLOSE_WAIT_S = 10.0


@dataclass(frozen=True)
class Outcome:
    response: ExecuteResponse
    lost: bool  # the agent died: a session on it is over
    clean: bool  # the agent reset everything after the program


class AgentLost(Exception):
    """The agent died or stopped answering."""


@functools.cache
def _sources() -> tuple[str, str]:
    return AGENT_PATH.read_text(), LAUNCHER_PATH.read_text()


def agent_command(python: str) -> list[str]:
    """The agent's command line: its source and its launcher's, so it needs no files."""
    return [python, "-I", "-S", "-c", *_sources()]


class Agent(ABC):
    """One agent and its connection; blocking, called from the backend's threads."""

    def __init__(self, slot: int, uid: int | None, image: str | None = None) -> None:
        self.slot = slot
        self.uid = uid
        self.image = image  # docker: the image of its pool
        self.uses = 0
        self._pending = bytearray()  # agent output not yet consumed

    def exchange(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        try:
            self._send(json.dumps(request).encode() + b"\n")
            while b"\n" not in self._pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AgentLost(f"no answer within {timeout_s:.0f} s")
                self._pending += self._receive(remaining)
        except OSError as exc:
            raise AgentLost(str(exc) or type(exc).__name__) from exc
        line, _, rest = self._pending.partition(b"\n")
        self._pending = bytearray(rest)
        self.uses += 1
        return dict(json.loads(line))

    def close(self) -> None:
        """Ask the agent to exit (its session's files go with its sandbox); wait until it has."""
        self._send(json.dumps({"op": "close"}).encode() + b"\n")
        deadline = time.monotonic() + CLOSE_WAIT_S
        with contextlib.suppress(AgentLost):  # raised at the end of its output: it has exited
            while (remaining := deadline - time.monotonic()) > 0:
                self._receive(remaining)

    @abstractmethod
    def _send(self, data: bytes) -> None: ...

    @abstractmethod
    def _receive(self, timeout_s: float) -> bytes:
        """Some of the agent's stdout (raises AgentLost at its end)."""

    @abstractmethod
    def remove(self) -> None: ...


class AgentBackend(ABC):
    name: str

    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings
        size = settings.sandbox_max_concurrency
        # One thread per agent in use, plus room for replacements being started.
        self._threads = ThreadPoolExecutor(max_workers=2 * size + 2,
                                           thread_name_prefix=f"sandbox-{self.name}")
        # A warm pool per image (the process backend has one, keyed None).
        self._idle: dict[str | None, asyncio.Queue[Agent]] = {
            image: asyncio.Queue() for image in self._images()}
        self._replacements: set[asyncio.Task[None]] = set()
        self._started = False
        self.python: str | None = None  # None: the agent's own interpreter
        self.python_version: str | None = None
        self.replaced = 0

    # -- what a backend provides -------------------------------------------------------------

    @abstractmethod
    def _prepare(self) -> None:
        """Blocking set-up before agents start (connect, check, remove leftovers)."""

    @abstractmethod
    def _start_agent(self, slot: int, image: str | None) -> Agent:
        """Blocking: a fresh agent for execution slot `slot` (of `image`'s pool)."""

    @abstractmethod
    def _teardown(self) -> None:
        """Blocking clean-up after every agent is gone."""

    def _check(self, request: ExecuteRequest) -> None:  # noqa: B027 - an optional hook
        """Refuse (InvalidInput) what this backend cannot honour."""

    def _images(self) -> list[str | None]:
        """The images agents run in, the default first (None: no images, the host)."""
        return [None]

    def _interpreters(self) -> list[str | None]:
        """Interpreters to try for programs, best first (None: the agent's own)."""
        return [None]

    def _lost_status(self, agent: Agent) -> ExecutionStatus:
        return ExecutionStatus.killed

    def _extra_description(self) -> dict[str, Any]:
        return {}

    # -- the pool ----------------------------------------------------------------------------

    async def start(self) -> None:
        await self._call(self._prepare)
        agents = await asyncio.gather(
            *(self._call(self._start_agent, slot, image) for image in self._idle
              for slot in range(self.settings.sandbox_max_concurrency)),
            return_exceptions=True)
        for agent in agents:
            if isinstance(agent, Agent):
                self._idle[agent.image].put_nowait(agent)
        self._started = True
        failed = [a for a in agents if isinstance(a, BaseException)]
        if failed:
            await self.aclose()
            raise RuntimeError(f"cannot start the {self.name} sandbox: {failed[0]}")
        await self._probe()

    async def _probe(self) -> None:
        """Pick the interpreter by running a program through the real sandbox, so a service
        that cannot isolate fails at start-up with the reason rather than on every request."""
        failures = []
        for python in self._interpreters():
            self.python = python
            try:
                result = await self.execute(ExecuteRequest(code=PROBE_CODE, timeout_s=30))
            except Unavailable as exc:
                failures.append(exc.message)
                continue
            if result.status is ExecutionStatus.ok:
                self.python_version = result.stdout.strip()
                return
            failures.append(f"{python}: {result.status} {result.stderr.strip()[-300:]}")
        await self.aclose()
        raise RuntimeError(f"no interpreter works in the {self.name} sandbox: "
                           + " | ".join(failures))

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "python": self.python,
                "python_version": self.python_version,
                "max_concurrency": self.settings.sandbox_max_concurrency,
                "idle": {str(image or "host"): queue.qsize()
                         for image, queue in self._idle.items()},
                "replaced": self.replaced,
                **self._extra_description()}

    async def execute(self, request: ExecuteRequest) -> ExecuteResponse:
        """One program on a pooled agent, which is reset (or replaced) afterwards."""
        self._check(request)
        pool = self._idle[self._image_for(request.image)]
        agent = await pool.get()
        try:
            outcome = await self._run_on(agent, request, keep_workdir=False)
        except (InvalidInput, Unavailable):
            pool.put_nowait(agent)  # the program could not start; the agent answered and is reset
            raise
        except BaseException:
            self._replace(agent)  # cancelled or confused mid-program: never reuse it
            raise
        if outcome.lost or not outcome.clean or agent.uses >= self.settings.sandbox_max_uses:
            self._replace(agent)
        else:
            pool.put_nowait(agent)
        return outcome.response

    def _image_for(self, requested: str | None) -> str | None:
        images = list(self._idle)
        if requested is None:
            return images[0]
        if requested not in self._idle:
            if images == [None]:
                raise InvalidInput(f"this sandbox runs programs on the host ({self.name} "
                                   f"backend): it has no image {requested!r}")
            raise InvalidInput(f"image {requested!r} is not one this sandbox serves; it serves "
                               f"{', '.join(map(str, images))}", {"images": images})
        return requested

    # -- sessions: an agent of their own, whose workdir outlives each program ----------------

    async def open_session(self, number: int, image: str | None) -> Agent:
        """A dedicated agent for session `number` (0 ≤ number < sandbox_max_sessions)."""
        self._check_started()
        return await self._call(self._start_agent, self.settings.sandbox_max_concurrency + number,
                                self._image_for(image))

    async def run_in_session(self, agent: Agent, request: ExecuteRequest) -> Outcome:
        self._check(request)
        return await self._run_on(agent, request, keep_workdir=True)

    async def close_session(self, agent: Agent) -> None:
        with contextlib.suppress(AgentLost, OSError):  # an agent already gone has nothing left
            await self._call(agent.close)
        await self._call(agent.remove)

    # -- running a program -------------------------------------------------------------------

    def _check_started(self) -> None:
        if not self._started:
            raise Unavailable("the sandbox backend is not started")

    async def _run_on(self, agent: Agent, request: ExecuteRequest,
                      keep_workdir: bool) -> Outcome:
        self._check_started()
        payload = {
            "language": request.language.value,
            "code": request.code, "stdin": request.stdin, "timeout_s": request.timeout_s,
            "files": [{"path": f.path, "data": base64.b64encode(f.data()).decode()}
                      for f in request.files],
            "collect": request.collect,
            "max_collect_bytes": self.settings.sandbox_max_collect_bytes,
            "max_output_bytes": request.max_output_bytes,
            "overflow_bytes": self.settings.sandbox_output_overflow_bytes,
            "uid": agent.uid, "python": self.python,
            "limits": rlimits(request, self.settings, own_uid=agent.uid is not None),
            "keep_workdir": keep_workdir,
        }
        started = time.monotonic()
        try:
            reply = await self._call(agent.exchange, payload, request.timeout_s + AGENT_GRACE_S)
        except AgentLost as exc:
            log.warning("%s sandbox agent (slot %d) lost: %s", self.name, agent.slot, exc)
            status = await self._call(self._lost_status, agent)
            lost = ExecuteResponse(status=status, exit_code=None, stdout="", stderr="",
                                   stdout_truncated=False, stderr_truncated=False,
                                   wall_s=round(time.monotonic() - started, 6), cpu_s=0.0,
                                   reason="sandbox_lost")
            return Outcome(lost, lost=True, clean=False)
        return Outcome(_response(reply), lost=False, clean=reply["clean"])

    async def aclose(self) -> None:
        for task in list(self._replacements):
            task.cancel()
        await asyncio.gather(*self._replacements, return_exceptions=True)
        for pool in self._idle.values():
            while not pool.empty():
                await self._call(pool.get_nowait().remove)
        if self._started:
            await self._call(self._teardown)
        self._started = False
        self._threads.shutdown(wait=False, cancel_futures=True)

    def _replace(self, old: Agent) -> None:
        self.replaced += 1

        async def replace() -> None:
            await self._call(old.remove)
            while True:
                try:
                    agent = await self._call(self._start_agent, old.slot, old.image)
                    self._idle[old.image].put_nowait(agent)
                    return
                except Exception as exc:  # noqa: BLE001 - keep trying; the pool must refill
                    log.error("cannot start a %s sandbox agent (retrying): %s", self.name, exc)
                    await asyncio.sleep(REPLACE_RETRY_S)

        task = asyncio.get_running_loop().create_task(replace())
        self._replacements.add(task)
        task.add_done_callback(self._replacements.discard)

    async def _call(self, function: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._threads, function, *args)


def _response(reply: dict[str, Any]) -> ExecuteResponse:
    failure = reply["start_failure"]
    if failure is not None:
        if failure["kind"] == "input":
            raise InvalidInput(failure["message"])
        raise Unavailable(f"the sandbox could not start the program: {failure['message']}")
    status, exit_code, signal_number = classify(reply["wait_status"], reply["reason"],
                                                reply["stderr_tail"])
    return ExecuteResponse(
        status=status, exit_code=exit_code, signal=signal_number, reason=reply["reason"],
        stdout=reply["stdout"], stderr=reply["stderr"],
        stdout_truncated=reply["stdout_truncated"], stderr_truncated=reply["stderr_truncated"],
        wall_s=round(reply["wall_s"], 6), cpu_s=round(reply["cpu_s"], 6),
        files=[FileOut.model_validate(f) for f in reply["files"]],
    )
