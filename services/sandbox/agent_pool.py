"""What both backends share: a pool of sandbox agents (`agent.py`), one program per agent at a
time, and the translation between execute requests and the agent's protocol.

A backend says how to start an agent (a local child process, or a container) by subclassing
`AgentBackend`; the pool hands agents out, puts them back after a clean run, and replaces in the
background any agent that died, failed its clean-up or served `max_uses` programs. An agent that
fails to start is retried a few times, then left to that background refill: start-up goes on
with the agents that did start (readiness says how many are warm and why the rest are not). The
blocking I/O with agents runs on a thread pool sized to the pool.
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
from collections.abc import Coroutine
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
START_ATTEMPTS = 3  # at start-up, per slot, before the slot is left to the background refill
RETRY_S, MAX_RETRY_S = 1.0, 30.0  # back-off between failed starts of one slot
# An agent empties its workdirs after answering; past this it is replaced instead.
RESET_WAIT_S = 60.0
CLOSE_WAIT_S = 10.0


@dataclass(frozen=True)
class Outcome:
    response: ExecuteResponse
    lost: bool  # the agent died: a session on it is over
    clean: bool  # the agent reset everything after the program
    resetting: bool  # the agent still empties its workdirs; a line with the result follows


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
        try:
            self._send(json.dumps(request).encode() + b"\n")
        except OSError as exc:
            raise AgentLost(str(exc) or type(exc).__name__) from exc
        reply = self._read_line(timeout_s)
        self.uses += 1
        return reply

    def read_reset(self, timeout_s: float) -> bool:
        """After a `resetting` answer: whether the agent emptied its workdirs."""
        return bool(self._read_line(timeout_s)["clean"])

    def _read_line(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        try:
            while b"\n" not in self._pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AgentLost(f"no answer within {timeout_s:.0f} s")
                self._pending += self._receive(remaining)
        except OSError as exc:
            raise AgentLost(str(exc) or type(exc).__name__) from exc
        line, _, rest = self._pending.partition(b"\n")
        self._pending = bytearray(rest)
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
        self.workers = 2 * size + 2
        self._threads = ThreadPoolExecutor(
            max_workers=self.workers, thread_name_prefix=f"sandbox-{self.name}"
        )
        # A warm pool per image (the process backend has one, keyed None).
        self._idle: dict[str | None, asyncio.Queue[Agent]] = {
            image: asyncio.Queue() for image in self._images()
        }
        self._warm = dict.fromkeys(self._idle, 0)  # agents of each pool: idle or running
        # Per image, the first failed start since its pool was last full.
        self._start_errors: dict[str | None, Exception] = {}
        self._background: set[asyncio.Task[None]] = set()  # replacements, refills, resets
        self._starting: set[asyncio.Future[Agent]] = set()  # see _start
        self._started = False
        self._closed = False
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
        """Fill the pools; fails only when the default pool has no agent at all (nothing could
        serve or run the probe), with the first failed start as the cause."""
        try:
            await self._call(self._prepare)
            await asyncio.gather(
                *(
                    self._fill_at_start(slot, image)
                    for image in self._idle
                    for slot in range(self.settings.sandbox_max_concurrency)
                )
            )
            self._started = True
            default = next(iter(self._idle))
            if not self._warm[default]:
                error = self._start_errors[default]
                raise RuntimeError(f"cannot start the {self.name} sandbox: {error}") from error
            await self._probe()
        except BaseException:
            await self.aclose()
            raise

    async def _fill_at_start(self, slot: int, image: str | None) -> None:
        if not await self._fill(slot, image, attempts=START_ATTEMPTS):
            self._in_background(self._fill(slot, image, attempts=None))

    async def _fill(self, slot: int, image: str | None, attempts: int | None) -> bool:
        """Start `slot`'s agent and pool it, retrying with back-off (for ever when `attempts`
        is None); False when it gave up."""
        delay, attempt = RETRY_S, 0
        while True:
            attempt += 1
            try:
                agent = await self._start(slot, image)
            except Exception as exc:  # noqa: BLE001 - any failed start is retried and reported
                self._start_errors.setdefault(image, exc)
                # Once per slot and round of tries is enough to see why (a missing image fails
                # every slot); readiness shows a refill that keeps failing.
                level = logging.WARNING if attempt == 1 else logging.DEBUG
                log.log(
                    level,
                    "cannot start a %s sandbox agent (slot %d, image %s, attempt %d): %s",
                    self.name,
                    slot,
                    image or "host",
                    attempt,
                    exc,
                )
                if attempts is not None and attempt >= attempts:
                    return False
                await asyncio.sleep(delay)
                delay = min(2 * delay, MAX_RETRY_S)
                continue
            self._warm[image] += 1
            if self._warm[image] == self.settings.sandbox_max_concurrency:
                self._start_errors.pop(image, None)
            self._idle[image].put_nowait(agent)
            return True

    async def _start(self, slot: int, image: str | None) -> Agent:
        """A new agent. The start runs on in its thread if the caller is cancelled, so it is
        shielded and left in `_starting` for aclose to wait for and remove: closing the
        client under a start hid the real error (issue 39) and leaked its container."""
        future = asyncio.ensure_future(self._call(self._start_agent, slot, image))
        self._starting.add(future)
        try:
            agent: Agent = await asyncio.shield(future)
        except Exception:
            self._starting.discard(future)
            raise
        self._starting.discard(future)
        return agent

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
        raise RuntimeError(
            f"no interpreter works in the {self.name} sandbox: " + " | ".join(failures)
        )

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "python": self.python,
            "python_version": self.python_version,
            "max_concurrency": self.settings.sandbox_max_concurrency,
            "idle": {str(image or "host"): queue.qsize() for image, queue in self._idle.items()},
            "warm": {str(image or "host"): warm for image, warm in self._warm.items()},
            "start_errors": {
                str(image or "host"): str(error) for image, error in self._start_errors.items()
            },
            "replaced": self.replaced,
            **self._extra_description(),
        }

    async def execute(self, request: ExecuteRequest) -> ExecuteResponse:
        """One program on a pooled agent, which is reset (or replaced) afterwards."""
        self._check(request)
        image = self._image_for(request.image)
        if not self._warm[image] and image in self._start_errors:
            raise Unavailable(
                f"no {self.name} sandbox of {image or 'the host'} has started: "
                f"{self._start_errors[image]}"
            )
        pool = self._idle[image]
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
        elif outcome.resetting:
            self._in_background(self._pool_after_reset(agent))
        else:
            pool.put_nowait(agent)
        return outcome.response

    async def _pool_after_reset(self, agent: Agent) -> None:
        """The agent answered before emptying its workdirs, so a program that left many files
        still gets its answer (`timeout`, say) in time; it rejoins the pool once it is empty."""
        try:
            clean = await self._call(agent.read_reset, RESET_WAIT_S)
        except AgentLost as exc:
            log.warning(
                "%s sandbox agent (slot %d) lost in its reset: %s", self.name, agent.slot, exc
            )
            clean = False
        if clean:
            self._idle[agent.image].put_nowait(agent)
        else:
            self._replace(agent)

    def _image_for(self, requested: str | None) -> str | None:
        images = list(self._idle)
        if requested is None:
            return images[0]
        if requested not in self._idle:
            if images == [None]:
                raise InvalidInput(
                    f"this sandbox runs programs on the host ({self.name} "
                    f"backend): it has no image {requested!r}"
                )
            raise InvalidInput(
                f"image {requested!r} is not one this sandbox serves; it serves "
                f"{', '.join(map(str, images))}",
                {"images": images},
            )
        return requested

    # -- sessions: an agent of their own, whose workdir outlives each program ----------------

    async def open_session(self, number: int, image: str | None) -> Agent:
        """A dedicated agent for session `number` (0 ≤ number < sandbox_max_sessions)."""
        self._check_started()
        return await self._start(
            self.settings.sandbox_max_concurrency + number, self._image_for(image)
        )

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

    async def _run_on(self, agent: Agent, request: ExecuteRequest, keep_workdir: bool) -> Outcome:
        self._check_started()
        payload = {
            "language": request.language.value,
            "code": request.code,
            "stdin": request.stdin,
            "timeout_s": request.timeout_s,
            "files": [
                {"path": f.path, "data": base64.b64encode(f.data()).decode()} for f in request.files
            ],
            "collect": request.collect,
            "max_collect_bytes": self.settings.sandbox_max_collect_bytes,
            "max_output_bytes": request.max_output_bytes,
            "overflow_bytes": self.settings.sandbox_output_overflow_bytes,
            "uid": agent.uid,
            "python": self.python,
            "limits": rlimits(request, self.settings, own_uid=agent.uid is not None),
            "keep_workdir": keep_workdir,
        }
        started = time.monotonic()
        try:
            reply = await self._call(agent.exchange, payload, request.timeout_s + AGENT_GRACE_S)
        except AgentLost as exc:
            log.warning("%s sandbox agent (slot %d) lost: %s", self.name, agent.slot, exc)
            status = await self._call(self._lost_status, agent)
            lost = ExecuteResponse(
                status=status,
                exit_code=None,
                stdout="",
                stderr="",
                stdout_truncated=False,
                stderr_truncated=False,
                wall_s=round(time.monotonic() - started, 6),
                cpu_s=0.0,
                reason="sandbox_lost",
            )
            return Outcome(lost, lost=True, clean=False, resetting=False)
        return Outcome(
            _response(reply), lost=False, clean=reply["clean"], resetting=reply["resetting"]
        )

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        # Starts under way end before the client they use is closed; their agents go too.
        started = await asyncio.gather(*self._starting, return_exceptions=True)
        agents = [agent for agent in started if isinstance(agent, Agent)]
        for pool in self._idle.values():
            while not pool.empty():
                agents.append(pool.get_nowait())
        await asyncio.gather(*(self._call(agent.remove) for agent in agents))
        await self._call(self._teardown)
        self._started = False
        self._threads.shutdown(wait=False, cancel_futures=True)

    def _replace(self, old: Agent) -> None:
        self.replaced += 1
        self._warm[old.image] -= 1

        async def replace() -> None:
            await self._call(old.remove)
            await self._fill(old.slot, old.image, attempts=None)

        self._in_background(replace())

    def _in_background(self, work: Coroutine[Any, Any, Any]) -> None:
        # A request ending during shutdown drops its agent: docker's teardown removes the
        # container, and a process agent exits when its stdin closes.
        if self._closed:
            work.close()
            return
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _call(self, function: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._threads, function, *args)


def _response(reply: dict[str, Any]) -> ExecuteResponse:
    failure = reply["start_failure"]
    if failure is not None:
        if failure["kind"] == "input":
            raise InvalidInput(failure["message"])
        raise Unavailable(f"the sandbox could not start the program: {failure['message']}")
    status, exit_code, signal_number = classify(
        reply["wait_status"], reply["reason"], reply["stderr_tail"]
    )
    return ExecuteResponse(
        status=status,
        exit_code=exit_code,
        signal=signal_number,
        reason=reply["reason"],
        stdout=reply["stdout"],
        stderr=reply["stderr"],
        stdout_truncated=reply["stdout_truncated"],
        stderr_truncated=reply["stderr_truncated"],
        wall_s=round(reply["wall_s"], 6),
        cpu_s=round(reply["cpu_s"], 6),
        files=[FileOut.model_validate(f) for f in reply["files"]],
    )
