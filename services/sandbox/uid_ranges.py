"""A range of uids per service instance, so two sandbox services on one host never share one.

Ranges are fixed blocks from the base uid (`base + k * BLOCK`); a service holds the `flock` of
its block's lock file, in a directory every instance on the host uses, for as long as it runs.
The kernel drops the lock when the process ends, however it ends, so a crashed service's block
is free again, and the next holder first kills whatever that service left running: processes
whose *real* uid is in the block (a program can change its effective uid back and forth, never
its real one without root).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Execution slots (≤ 256) plus session slots (≤ 1024) of one instance fit in a block.
BLOCK = 2048
BLOCKS = 64
SWEEP_ROUNDS = 100


@dataclass
class UidRange:
    start: int
    size: int
    _lock_fd: int

    def uid(self, slot: int) -> int:
        if not 0 <= slot < self.size:
            raise ValueError(f"slot {slot} is outside the uid range of {self.size}")
        return self.start + slot

    def release(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing the last descriptor drops the flock
            self._lock_fd = -1


def claim(lock_dir: Path, base: int, avoid: frozenset[int] = frozenset()) -> UidRange:
    """The first free block at or above `base` that holds none of the uids in `avoid` (the
    docker backend's program uid: a claim kills whatever runs under the block's uids); kills
    what an earlier holder left behind."""
    lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    for k in range(BLOCKS):
        start = base + k * BLOCK
        if any(start <= uid < start + BLOCK for uid in avoid):
            continue
        fd = os.open(lock_dir / f"uids-{start}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            # flock, not fcntl locks: those are per process, and two services in one process
            # (tests) would both get the same block.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        kill_processes_of(range(start, start + BLOCK))
        return UidRange(start, BLOCK, fd)
    raise RuntimeError(
        f"all {BLOCKS} sandbox uid ranges from {base} are held by other "
        f"services (locks in {lock_dir})"
    )


def sweep_abandoned(lock_dir: Path, clean: Callable[[int], None]) -> None:
    """Clean every block whose lock file no service holds (a service that was killed): its
    processes are killed and `clean(start)` removes the rest, under the block's lock so no
    service claims it meanwhile."""
    for path in lock_dir.glob("uids-*.lock"):
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            start = int(path.stem.removeprefix("uids-"))
            kill_processes_of(range(start, start + BLOCK))
            clean(start)
        except BlockingIOError:
            continue  # held: a running service's block (this one's included)
        finally:
            os.close(fd)


def processes_of(uids: range, proc: Path = Path("/proc")) -> set[int]:
    """Live (non-zombie) processes on the host whose real uid is in `uids`."""
    found = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            status = (entry / "status").read_text()
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if int(fields["Uid"].split()[0]) in uids and fields["State"].split()[0] != "Z":
                found.add(int(entry.name))
    return found


def kill_processes_of(uids: range) -> None:
    for _ in range(SWEEP_ROUNDS):
        alive = processes_of(uids)
        if not alive:
            return
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    raise RuntimeError(f"processes of uids {uids.start}-{uids.stop - 1} keep appearing")
