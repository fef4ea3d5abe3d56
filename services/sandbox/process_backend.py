"""The process backend: each agent is a local child process of the service, one per execution
slot. A program gets new network and mount namespaces with a fresh tmpfs on every
world-writable directory (its workdir inside the private /tmp), rlimits, no new privileges and,
when the service runs as root, a uid of its own per slot, so sandboxes cannot read the
service's files or signal each other; the agent kills all of it at the end."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import subprocess
import sys
from typing import Any

from services.sandbox.agents import Agent, AgentBackend, AgentLost, agent_command
from services.sandbox.settings import SandboxSettings

log = logging.getLogger(__name__)

FALLBACK_INTERPRETERS = ("/usr/local/bin/python3", "/usr/bin/python3")
CHUNK = 65536


class LocalAgent(Agent):
    def __init__(self, slot: int, uid: int | None) -> None:
        super().__init__(slot, uid)
        # Root, like the service: it forks programs and drops them to the slot's uid.
        self.process = subprocess.Popen(
            agent_command(sys.executable),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
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
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        with contextlib.suppress(OSError):
            self._stdin.close()
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


class ProcessBackend(AgentBackend):
    name = "process"

    def __init__(self, settings: SandboxSettings) -> None:
        super().__init__(settings)
        as_root = os.geteuid() == 0
        base = settings.sandbox_user_id_base if as_root else None
        self._uid_base = base

    def _prepare(self) -> None:
        """Agents start on demand; nothing to connect to."""

    def _teardown(self) -> None:
        """Every agent has been removed; programs died with them."""

    def _start_agent(self, slot: int, image: str | None) -> LocalAgent:
        return LocalAgent(slot, None if self._uid_base is None else self._uid_base + slot)

    def _interpreters(self) -> list[str | None]:
        if self.settings.sandbox_python:
            return [self.settings.sandbox_python]
        return list(dict.fromkeys([sys.executable, *FALLBACK_INTERPRETERS]))

    def _private_mounts_mb(self) -> int | None:
        return self.settings.sandbox_tmp_mb

    def _extra_description(self) -> dict[str, Any]:
        return {"isolated_uid": self._uid_base is not None}
