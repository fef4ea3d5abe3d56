"""OS-level helpers for sandboxed processes: exit notification, killing, and reaping.

Everything a sandbox starts is killed when its execution ends: its process group, and (when it
runs under its own uid) every process of that uid, which also catches children that left the
group with `setsid`. The service becomes a child subreaper so orphaned sandbox processes are
re-parented to it and can be reaped here, instead of piling up as zombies under an init that
may not reap them (they would count against the next sandbox's RLIMIT_NPROC).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import time

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def exit_future(pid: int) -> tuple[asyncio.Future[None], int]:
    """A future done when `pid` exits (it stays a zombie until reaped), and the pidfd to close.
    A pidfd refers to this very process, so it cannot be fooled by pid reuse."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    pidfd = os.pidfd_open(pid)

    def on_exit() -> None:
        loop.remove_reader(pidfd)
        if not future.done():
            future.set_result(None)

    loop.add_reader(pidfd, on_exit)
    return future, pidfd


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def kill_user_processes(uid: int, *, within_s: float = 5.0) -> int:
    """SIGKILL every process of `uid` and reap their zombies, until none is left (or `within_s`
    passes). Returns how many processes were killed. Repeats because a live process may fork
    between the scan and the kill (RLIMIT_NPROC bounds how long that can go on), and because
    the children of a dying process become ours (we are the subreaper) only once it is gone."""
    killed = 0
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        remaining = processes_of(uid)
        if not remaining:
            break
        for pid, state, ppid in remaining:
            if state != "Z":
                killed += 1
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            elif ppid == os.getpid():
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
        time.sleep(0.002)
    return killed


def processes_of(uid: int) -> list[tuple[int, str, int]]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        found.append((int(name), fields[0], int(fields[1])))
    return found
