"""Control groups for the process backend: one per execution slot, around the slot's whole
sandbox (bubblewrap, the agent, the launcher and every program), so memory, processes and CPU
are limited for the process tree as a whole, not per process as rlimits are.

cgroup v2 is used when its memory, pids and cpu controllers are available at /sys/fs/cgroup;
otherwise the v1 hierarchies of those controllers (hybrid hosts, many CI machines). A service
instance owns `loom-sandbox/<instance>` in each hierarchy; a slot is a leaf below it. A process
joins by writing its pid to `cgroup.procs` before it execs (see `join_command`), so no
descendant can start outside the group.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from abc import ABC, abstractmethod
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu")
TOP = "loom-sandbox"
CPU_PERIOD_US = 100_000
# The kernel's weight of one plain task (cpu.shares in v1, cpu.weight in v2, its maximum).
TASK_SHARES, TASK_WEIGHT, MAX_WEIGHT = 1024, 100, 10_000
KILL_WAIT_S = 5.0


class CgroupError(RuntimeError):
    """Control groups cannot be used here (with the reason)."""


class SlotCgroup(ABC):
    """The control group of one slot, in every hierarchy it needs."""

    def __init__(self, directories: list[Path]) -> None:
        self.directories = directories
        self._memory_bytes: int | None = None
        for directory in directories:
            directory.mkdir(parents=True, exist_ok=True)

    @property
    def procs_files(self) -> list[str]:
        """Where a process writes its pid to join (every hierarchy)."""
        return [str(d / "cgroup.procs") for d in self.directories]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for directory in self.directories:
            with contextlib.suppress(FileNotFoundError):
                found |= {int(p) for p in (directory / "cgroup.procs").read_text().split()}
        return found

    def set_memory(self, limit_bytes: int) -> None:
        """The whole tree's memory limit (page cache and tmpfs included); only written when it
        changes, so the usual request costs nothing here."""
        if limit_bytes != self._memory_bytes:
            self._write_memory(limit_bytes)
            self._memory_bytes = limit_bytes

    @abstractmethod
    def _write_memory(self, limit_bytes: int) -> None: ...

    @abstractmethod
    def set_pids(self, maximum: int) -> None: ...

    @abstractmethod
    def set_cpus(self, cpus: float) -> None: ...

    @abstractmethod
    def oom_kills(self) -> int:
        """Processes the kernel has killed for this group's memory limit so far."""

    def kill_all(self) -> None:
        """SIGKILL everything in the group until it is empty (forks may race a sweep)."""
        deadline = time.monotonic() + KILL_WAIT_S
        while pids := self.pids():
            if time.monotonic() > deadline:
                raise CgroupError(
                    f"processes {sorted(pids)} outlive SIGKILL in {self.directories[0]}"
                )
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)

    def remove(self) -> None:
        self.kill_all()
        for directory in self.directories:
            _rmdir_when_empty(directory)


class SlotCgroupV2(SlotCgroup):
    def _write_memory(self, limit_bytes: int) -> None:
        _write(self.directories[0] / "memory.max", limit_bytes)

    def set_pids(self, maximum: int) -> None:
        _write(self.directories[0] / "pids.max", maximum)
        # Memory over the limit must not go to swap instead.
        with contextlib.suppress(FileNotFoundError):
            _write(self.directories[0] / "memory.swap.max", 0)

    def set_cpus(self, cpus: float) -> None:
        _write(self.directories[0] / "cpu.max", f"{int(cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")

    def oom_kills(self) -> int:
        return _counter(self.directories[0] / "memory.events", "oom_kill")

    def kill_all(self) -> None:
        kill = self.directories[0] / "cgroup.kill"  # atomic, kernel ≥ 5.14
        if kill.exists() and self.pids():
            _write(kill, 1)
        super().kill_all()


class SlotCgroupV1(SlotCgroup):
    def __init__(self, directories: list[Path]) -> None:
        super().__init__(directories)
        self.memory, self.pids_dir, self.cpu = directories

    def _write_memory(self, limit_bytes: int) -> None:
        # memsw (memory + swap) must stay ≥ the memory limit at every step; it exists only
        # with swap accounting.
        memory = self.memory / "memory.limit_in_bytes"
        files = [memory]
        memsw = self.memory / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            raising = limit_bytes > int(memory.read_text())
            files = [memsw, memory] if raising else [memory, memsw]
        for path in files:
            _write(path, limit_bytes)

    def set_pids(self, maximum: int) -> None:
        _write(self.pids_dir / "pids.max", maximum)
        with contextlib.suppress(FileNotFoundError):
            _write(self.memory / "memory.swappiness", 0)

    def set_cpus(self, cpus: float) -> None:
        _write(self.cpu / "cpu.cfs_period_us", CPU_PERIOD_US)
        _write(self.cpu / "cpu.cfs_quota_us", int(cpus * CPU_PERIOD_US))

    def oom_kills(self) -> int:
        return _counter(self.memory / "memory.oom_control", "oom_kill")


class Cgroups:
    """The service instance's control groups: `<hierarchy>/loom-sandbox/<instance>/slot-N`."""

    def __init__(self, instance: str, root: Path = ROOT) -> None:
        self.version, self._bases = _hierarchies(root)
        self.instances = [base / TOP / instance for base in self._bases]

    def create(self, slots: int) -> None:
        """The instance's own groups, ready for `slots` slots' groups below them."""
        if self.version == 2:
            for directory in (self._bases[0], self._bases[0] / TOP, self.instances[0]):
                directory.mkdir(exist_ok=True)
                # Children may only use the controllers their parent hands down.
                _write(directory / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
        # A group competes for CPU with its siblings as one task would: left at the default,
        # all the sandboxes together would weigh one task against the host's others. Weighed
        # as their slots, they get what as many plain processes would; each slot's quota
        # still caps what one program tree can take.
        cpu = self.instances[0] if self.version == 2 else self.instances[CONTROLLERS.index("cpu")]
        for directory in (cpu.parent, cpu):
            directory.mkdir(parents=True, exist_ok=True)
            if self.version == 2:
                _write(directory / "cpu.weight", min(MAX_WEIGHT, TASK_WEIGHT * slots))
            else:
                _write(directory / "cpu.shares", TASK_SHARES * slots)

    def slot(self, slot: int) -> SlotCgroup:
        directories = [instance / f"slot-{slot}" for instance in self.instances]
        try:
            return (SlotCgroupV2 if self.version == 2 else SlotCgroupV1)(directories)
        except OSError as exc:
            raise CgroupError(
                f"cannot create the control group {directories[0]}: {exc.strerror}"
            ) from exc

    def slot_names(self) -> list[str]:
        """The slots' groups that exist, in any hierarchy."""
        return sorted(
            {
                child.name
                for instance in self.instances
                if instance.is_dir()
                for child in instance.iterdir()
                if child.is_dir()
            }
        )

    def remove_all(self) -> None:
        """Every slot's group and the instance's own, leftovers of a crashed run included."""
        for name in self.slot_names():
            group = (SlotCgroupV2 if self.version == 2 else SlotCgroupV1)(
                [instance / name for instance in self.instances]
            )
            group.remove()
        for instance in self.instances:
            _rmdir_when_empty(instance)


def _hierarchies(root: Path) -> tuple[int, list[Path]]:
    """(version, [hierarchy root per controller]); v2 when it has every controller."""
    controllers = root / "cgroup.controllers"
    if controllers.exists():
        available = set(controllers.read_text().split())
        if available.issuperset(CONTROLLERS):
            return 2, [root]
        raise CgroupError(
            f"cgroup v2 at {root} lacks the controllers {sorted(set(CONTROLLERS) - available)}"
        )
    bases = [root / c for c in CONTROLLERS]
    missing = [str(b) for b in bases if not (b / "cgroup.procs").exists()]
    if missing:
        raise CgroupError(
            f"no cgroup v2 with memory, pids and cpu at {root}, and no cgroup v1 "
            f"hierarchy at {', '.join(missing)}"
        )
    return 1, bases


def _write(path: Path, value: object) -> None:
    with open(path, "w") as fh:
        fh.write(str(value))


def _counter(path: Path, name: str) -> int:
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    return 0


def _rmdir_when_empty(directory: Path) -> None:
    # A group is removable once its last process has been reaped, a moment after SIGKILL.
    deadline = time.monotonic() + KILL_WAIT_S
    while True:
        try:
            directory.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise CgroupError(
                    f"cannot remove the control group {directory}: {exc.strerror}"
                ) from exc
            time.sleep(0.01)


def join_command(procs_files: list[str], command: list[str]) -> list[str]:
    """`command`, run by a shell that first moves itself into the groups (every descendant of
    the exec'd command starts inside them)."""
    script = (
        'for f; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; shift; done; '
        'shift; exec "$@"'
    )
    return ["/bin/sh", "-c", script, "sh", *procs_files, "--", *command]
