"""What every backend shares about one execution: the rlimits a program runs under and how the
way it ended maps to a status."""

from __future__ import annotations

import math
import os
import re
import signal

from services.sandbox.schemas import ExecuteRequest, ExecutionStatus
from services.sandbox.settings import SandboxSettings

# Python reports a failed allocation as MemoryError; C code and the loader in their own words.
OUT_OF_MEMORY = re.compile(r"^MemoryError\b|Cannot allocate memory|std::bad_alloc", re.MULTILINE)
MIB = 1024 * 1024


def rlimits(
    request: ExecuteRequest, settings: SandboxSettings, own_uid: bool
) -> dict[str, tuple[int, int]]:
    cpu = math.ceil(request.timeout_s) + 1  # wall-clock fires first; SIGXCPU is a backstop
    limits = {
        "RLIMIT_AS": (request.memory_mb * MIB, request.memory_mb * MIB),
        "RLIMIT_CPU": (cpu, cpu + 1),
        "RLIMIT_FSIZE": (settings.sandbox_max_file_mb * MIB,) * 2,
        "RLIMIT_NOFILE": (settings.sandbox_max_open_files,) * 2,
        "RLIMIT_CORE": (0, 0),
    }
    # RLIMIT_NPROC counts every process of the real uid and root ignores it: it means
    # something only when the sandbox has a uid of its own.
    if own_uid:
        limits["RLIMIT_NPROC"] = (settings.sandbox_max_processes,) * 2
    return limits


def classify(
    wait_status: int, reason: str | None, stderr_tail: str
) -> tuple[ExecutionStatus, int | None, int | None]:
    """(status, exit code, signal) of a program from its wait status and why it was stopped."""
    if os.WIFSIGNALED(wait_status):
        signal_number = os.WTERMSIG(wait_status)
        if reason == "timeout" or signal_number == signal.SIGXCPU:
            return ExecutionStatus.timeout, None, signal_number
        return ExecutionStatus.killed, None, signal_number
    exit_code = os.WEXITSTATUS(wait_status)
    if exit_code == 0:
        return ExecutionStatus.ok, 0, None
    if OUT_OF_MEMORY.search(stderr_tail):
        return ExecutionStatus.oom, exit_code, None
    return ExecutionStatus.error, exit_code, None
