"""The process backend: no daemon, each execution slot's agent in a long-lived bubblewrap
sandbox of its own (confinement.py), inside a control group of its own (cgroups.py).

The shape is the docker backend's: the agent and its warm launcher live in the sandbox, run
each program as the slot's unprivileged uid in the sandbox's /work and /tmp, and empty those
afterwards, so a program starts as fast as a fork. What bubblewrap cannot give per program the
service sets on the slot's group before each request: the memory limit of the whole tree
(`memory_mb` + the agent's own share), a pids limit and a CPU quota, so a fork bomb or four
children of 400 MB are stopped as one. A request asking for more memory than
`sandbox_process_memory_mb` is refused (422).

Each service instance claims a uid range of its own (uid_ranges.py) and names its control
groups after it, so two services on one host neither share a uid nor touch each other's groups.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

from services.common.errors import InvalidInput, Unavailable
from services.sandbox import seccomp
from services.sandbox.agent_pool import Agent, AgentBackend, AgentLost, Outcome, agent_command
from services.sandbox.cgroups import CgroupError, Cgroups, SlotCgroup, join_command
from services.sandbox.confinement import (
    bwrap_command,
    bwrap_version,
    find_bwrap,
    interpreter_prefix,
)
from services.sandbox.outcome import MIB
from services.sandbox.schemas import ExecuteRequest, ExecutionStatus
from services.sandbox.settings import SandboxSettings
from services.sandbox.uid_ranges import UidRange, claim, sweep_abandoned

log = logging.getLogger(__name__)

FALLBACK_INTERPRETERS = ("/usr/local/bin/python3", "/usr/bin/python3")
CHUNK = 65536
# Memory of the slot's own processes (bubblewrap, the agent, the launcher), on top of a
# program's `memory_mb`.
AGENT_MEMORY_MB = 64
# bubblewrap's two processes, the agent, the launcher and a forked program being set up.
AGENT_PROCESSES = 8


class LocalAgent(Agent):
    def __init__(
        self,
        slot: int,
        uid: int | None,
        command: list[str],
        seccomp_fd: int,
        cgroup: SlotCgroup | None,
    ) -> None:
        super().__init__(slot, uid)
        self.cgroup = cgroup
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            pass_fds=(seccomp_fd,),
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
            start_new_session=True,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._stdin, self._stdout = self.process.stdin, self.process.stdout.fileno()

    def _send(self, data: bytes) -> None:
        self._stdin.write(data)
        self._stdin.flush()

    def _receive(self, timeout_s: float) -> bytes:
        readable, _, _ = select.select([self._stdout], [], [], timeout_s)
        if not readable:
            raise AgentLost("no answer in time")
        chunk = os.read(self._stdout, CHUNK)
        if not chunk:
            raise AgentLost(f"the agent exited ({self.process.poll()})")
        return chunk

    def remove(self) -> None:
        # bubblewrap's own process first: the sandbox's init, and with it the whole PID
        # namespace, dies with it (--die-with-parent); the group then catches any straggler.
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        with contextlib.suppress(OSError):
            self._stdin.close()
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        if self.cgroup is not None:
            try:
                self.cgroup.remove()
            except CgroupError as exc:  # the service's teardown sweeps the groups again
                log.warning("sandbox slot %d: %s", self.slot, exc)


class ProcessBackend(AgentBackend):
    name = "process"

    def __init__(self, settings: SandboxSettings) -> None:
        super().__init__(settings)
        self._as_root = os.geteuid() == 0
        self._bwrap = ""
        self._bwrap_version: str | None = None
        self._uids: UidRange | None = None
        self.cgroups: Cgroups | None = None
        self._agent_python = os.path.realpath(sys.executable)

    def _prepare(self) -> None:
        """Everything a slot needs, checked before any agent starts: a service that cannot
        confine programs fails at start-up with the reason rather than run them bare."""
        self._bwrap = find_bwrap(self.settings.sandbox_bwrap)
        self._bwrap_version = bwrap_version(self._bwrap)
        if not seccomp.supported():
            raise RuntimeError(
                f"the process sandbox has no seccomp filter for the "
                f"{seccomp.machine()} architecture: use the docker backend"
            )
        base = self.settings.sandbox_user_id_base
        if self._as_root and base is not None:
            self._uids = claim(
                Path(self.settings.sandbox_lock_dir),
                base,
                avoid=frozenset({self.settings.sandbox_docker_user_id}),
            )
        if not self._as_root:
            log.warning(
                "the process sandbox runs as uid %d, not root: programs share that uid "
                "and have no control group (rlimits only); run the service as root "
                "or use the docker backend",
                os.geteuid(),
            )
            return
        instance = f"uids-{self._uids.start}" if self._uids else f"pid-{os.getpid()}"
        try:
            self.cgroups = Cgroups(instance)
            self.cgroups.remove_all()  # what a crashed holder of the range left
            self.cgroups.create(self.settings.sandbox_max_concurrency)
            if self._uids:  # and what other killed services left in theirs
                sweep_abandoned(
                    Path(self.settings.sandbox_lock_dir),
                    lambda start: Cgroups(f"uids-{start}").remove_all(),
                )
        except (OSError, RuntimeError) as exc:
            self._release_uids()
            raise RuntimeError(
                f"the process sandbox cannot limit memory, processes and CPU "
                f"with control groups: {exc}"
            ) from exc

    def _teardown(self) -> None:
        """Every agent has been removed; remove the instance's groups and free its uids."""
        if self.cgroups is not None:
            self.cgroups.remove_all()
        self._release_uids()

    def _release_uids(self) -> None:
        if self._uids is not None:
            self._uids.release()
            self._uids = None

    def _check(self, request: ExecuteRequest) -> None:
        limit = self.settings.sandbox_process_memory_mb
        if request.memory_mb > limit:
            raise InvalidInput(
                f"memory_mb={request.memory_mb} is above this sandbox's limit of "
                f"{limit} MiB per program (LOOM_SANDBOX_PROCESS_MEMORY_MB)",
                {"limit": limit},
            )

    def _start_agent(self, slot: int, image: str | None) -> LocalAgent:
        uid = self._uids.uid(slot) if self._uids else None
        cgroup = self._slot_cgroup(slot)
        prefixes = [
            p
            for p in map(
                interpreter_prefix, [self._agent_python, *filter(None, self._interpreters())]
            )
            if p is not None
        ]
        seccomp_fd = os.memfd_create("loom-seccomp", 0)  # not CLOEXEC: bubblewrap reads it
        try:
            os.write(seccomp_fd, seccomp.filter_bytes())
            os.lseek(seccomp_fd, 0, os.SEEK_SET)
            command = bwrap_command(
                self._bwrap,
                prefixes=prefixes,
                tmp_mb=self.settings.sandbox_tmp_mb,
                seccomp_fd=seccomp_fd,
                as_root=self._as_root,
            ) + agent_command(self._agent_python)
            if cgroup is not None:
                command = join_command(cgroup.procs_files, command)
            return LocalAgent(slot, uid, command, seccomp_fd, cgroup)
        except BaseException:
            if cgroup is not None:
                cgroup.remove()
            raise
        finally:
            os.close(seccomp_fd)

    def _slot_cgroup(self, slot: int) -> SlotCgroup | None:
        if self.cgroups is None:
            return None
        cgroup = self.cgroups.slot(slot)
        cgroup.set_pids(self.settings.sandbox_max_processes + AGENT_PROCESSES)
        cgroup.set_cpus(self.settings.sandbox_process_cpus)
        cgroup.set_memory(self._memory_limit(self.settings.sandbox_process_memory_mb))
        return cgroup

    @staticmethod
    def _memory_limit(memory_mb: int) -> int:
        return (memory_mb + AGENT_MEMORY_MB) * MIB

    async def _run_on(self, agent: Agent, request: ExecuteRequest, keep_workdir: bool) -> Outcome:
        """Set the slot's limits for this request; a program the kernel killed for the
        group's memory limit is reported as `oom`."""
        assert isinstance(agent, LocalAgent)
        cgroup = agent.cgroup
        if cgroup is None:
            return await super()._run_on(agent, request, keep_workdir)
        try:
            cgroup.set_memory(self._memory_limit(request.memory_mb))  # written only on a change
        except OSError as exc:  # e.g. EBUSY: the slot holds more than the new limit
            raise Unavailable(
                f"cannot set the sandbox's memory limit to {request.memory_mb} MiB: {exc.strerror}"
            ) from exc
        oom_kills = cgroup.oom_kills()
        outcome = await super()._run_on(agent, request, keep_workdir)
        if outcome.response.status is ExecutionStatus.killed and cgroup.oom_kills() > oom_kills:
            response = outcome.response.model_copy(update={"status": ExecutionStatus.oom})
            outcome = dataclasses.replace(outcome, response=response)
        return outcome

    def _interpreters(self) -> list[str | None]:
        # Real paths: the service's own may be a virtual environment's link, and nothing of a
        # project (a virtual environment included) is visible in the sandbox.
        if self.settings.sandbox_python:
            return [os.path.realpath(self.settings.sandbox_python)]
        candidates = [self._agent_python, *FALLBACK_INTERPRETERS]
        return list(dict.fromkeys(os.path.realpath(p) for p in candidates if os.path.exists(p)))

    def _extra_description(self) -> dict[str, Any]:
        uids = self._uids
        return {
            "isolated_uid": uids is not None,
            "uids": [uids.start, uids.start + uids.size - 1] if uids else None,
            "bwrap": self._bwrap_version,
            "cgroup": f"v{self.cgroups.version}" if self.cgroups else None,
            "max_memory_mb": self.settings.sandbox_process_memory_mb,
            "cpus_per_slot": self.settings.sandbox_process_cpus,
        }
