"""The process backend: each execution is a local child process confined by the launcher
(rlimits, private network namespace, its own uid when the service is root), run in a fresh
private temp directory with a scrubbed environment, and killed as a whole when it ends."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from services.common.errors import Unavailable
from services.sandbox import launcher
from services.sandbox.outcome import classify, rlimits
from services.sandbox.pipes import InputFeeder, OutputCapture
from services.sandbox.processes import (
    become_subreaper,
    exit_future,
    kill_group,
    kill_user_processes,
)
from services.sandbox.schemas import ExecuteRequest, ExecuteResponse, ExecutionStatus
from services.sandbox.settings import SandboxSettings

log = logging.getLogger(__name__)

FALLBACK_INTERPRETERS = ("/usr/local/bin/python3", "/usr/bin/python3")
PROBE_CODE = "import sys; print('%d.%d.%d' % sys.version_info[:3])"
# Pipes still held open by a killed program's descendants close within this grace period.
PIPE_GRACE_S = 1.0


class ProcessBackend:
    name = "process"

    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings
        as_root = os.geteuid() == 0
        base = settings.sandbox_user_id_base if as_root else None
        slots = range(settings.sandbox_max_concurrency)
        self._slot_uids: list[int | None] = [None if base is None else base + i for i in slots]
        self._free_slots: asyncio.Queue[int] | None = None
        self.python: str | None = None
        self.python_version: str | None = None

    async def start(self) -> None:
        """Pick the interpreter by running a probe through the real sandbox, so a service that
        cannot isolate (no namespaces, interpreter unreadable by the sandbox uid) fails at
        start-up with the reason rather than on every request."""
        self._free_slots = asyncio.Queue()
        for slot in range(len(self._slot_uids)):
            self._free_slots.put_nowait(slot)
        become_subreaper()
        candidates = ([self.settings.sandbox_python] if self.settings.sandbox_python
                      else [sys.executable, *FALLBACK_INTERPRETERS])
        failures = []
        for python in dict.fromkeys(candidates):
            try:
                result = await self._execute(ExecuteRequest(code=PROBE_CODE, timeout_s=30), python)
            except Unavailable as exc:
                failures.append(exc.message)
                continue
            if result.status is ExecutionStatus.ok:
                self.python, self.python_version = python, result.stdout.strip()
                if python != sys.executable:
                    log.warning("sandbox runs %s: the service's own Python is not usable by "
                                "the sandbox user", python)
                return
            failures.append(f"{python}: {result.status} {result.stderr.strip()[-300:]}")
        raise RuntimeError("no interpreter works inside the sandbox: " + " | ".join(failures))

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "python": self.python, "python_version": self.python_version,
                "isolated_uid": self._slot_uids[0] is not None,
                "max_concurrency": len(self._slot_uids)}

    async def execute(self, request: ExecuteRequest) -> ExecuteResponse:
        if self.python is None:
            raise Unavailable("the sandbox backend is not started")
        return await self._execute(request, self.python)

    async def aclose(self) -> None:
        """Executions clean up after themselves; nothing is held between requests."""

    async def _execute(self, request: ExecuteRequest, python: str) -> ExecuteResponse:
        assert self._free_slots is not None
        slot = await self._free_slots.get()
        try:
            uid = self._slot_uids[slot]
            with _private_workdir(self.settings.sandbox_work_root, uid) as workdir:
                (workdir / "main.py").write_text(request.code, encoding="utf-8")
                return await self._run(request, python, workdir, uid)
        finally:
            self._free_slots.put_nowait(slot)

    async def _run(self, request: ExecuteRequest, python: str, workdir: Path,
                   uid: int | None) -> ExecuteResponse:
        limits = rlimits(request, self.settings, own_uid=uid is not None)
        limit_arguments = [f"{name}={soft},{hard}" for name, (soft, hard) in limits.items()]
        arguments = [str(workdir), "-" if uid is None else str(uid),
                     str(self.settings.sandbox_tmp_mb), python, *limit_arguments]
        started = time.monotonic()
        pid, stdin_w, out_r, err_r = _spawn_launcher(arguments, _scrubbed_environment(workdir))
        loop = asyncio.get_running_loop()
        flood: asyncio.Future[None] = loop.create_future()

        def on_flood() -> None:
            if not flood.done():
                flood.set_result(None)

        overflow = self.settings.sandbox_output_overflow_bytes
        stdout = OutputCapture(out_r, request.max_output_bytes, overflow, on_flood)
        stderr = OutputCapture(err_r, request.max_output_bytes, overflow, on_flood)
        feeder = InputFeeder(stdin_w, request.stdin.encode("utf-8"))
        exited, pidfd = exit_future(pid)
        reason: str | None = None
        try:
            await asyncio.wait({exited, flood}, timeout=request.timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)
            if not exited.done():
                reason = "output_limit" if flood.done() else "timeout"
                kill_group(pid)
                await exited
            wall_s = time.monotonic() - started
        finally:
            # The leader is a zombie here, so its pgid cannot have been reused yet.
            kill_group(pid)
            loop.remove_reader(pidfd)
            os.close(pidfd)
            _, wait_status, usage = os.wait4(pid, 0)
            if uid is not None:
                # Off the event loop: after a fork bomb this can take a while.
                await asyncio.to_thread(kill_user_processes, uid)
            feeder.close()
            await asyncio.wait({stdout.closed, stderr.closed}, timeout=PIPE_GRACE_S)
            stdout.close()
            stderr.close()
        if _launcher_failed(wait_status, stderr.text()):
            raise Unavailable(f"the sandbox could not start: {stderr.text().strip()}")
        status, exit_code, signal_number = classify(wait_status, reason, stderr.tail_text())
        return ExecuteResponse(
            status=status, exit_code=exit_code, signal=signal_number, reason=reason,
            stdout=stdout.text(), stderr=stderr.text(),
            stdout_truncated=stdout.truncated, stderr_truncated=stderr.truncated,
            wall_s=round(wall_s, 6), cpu_s=round(usage.ru_utime + usage.ru_stime, 6),
        )


def _spawn_launcher(arguments: list[str], env: dict[str, str]) -> tuple[int, int, int, int]:
    """Start the launcher in a new session on fresh pipes: (pid, stdin, stdout, stderr) fds."""
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        pid = os.posix_spawn(
            sys.executable,
            [sys.executable, "-I", "-S", launcher.__file__, *arguments],
            env,
            file_actions=[(os.POSIX_SPAWN_DUP2, stdin_r, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
                          (os.POSIX_SPAWN_DUP2, err_w, 2)],
            setsid=True,
        )
    except BaseException:
        for fd in (stdin_w, out_r, err_r):
            os.close(fd)
        raise
    finally:
        for fd in (stdin_r, out_w, err_w):
            os.close(fd)
    return pid, stdin_w, out_r, err_r


def _launcher_failed(wait_status: int, stderr: str) -> bool:
    return (os.WIFEXITED(wait_status)
            and os.WEXITSTATUS(wait_status) == launcher.ISOLATION_FAILED_EXIT
            and stderr.startswith(launcher.MESSAGE_PREFIX))


def _scrubbed_environment(workdir: Path) -> dict[str, str]:
    """Only what a program needs: nothing from the service's environment gets through."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "LANG": "C.UTF-8",
        # Numeric libraries otherwise start a thread per core, and count against RLIMIT_AS.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


@contextlib.contextmanager
def _private_workdir(root: Path | None, uid: int | None) -> Iterator[Path]:
    workdir = Path(tempfile.mkdtemp(prefix="loom-sandbox-", dir=root))
    try:
        if uid is not None:
            os.chown(workdir, uid, uid)
        yield workdir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
