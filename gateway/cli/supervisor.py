"""Run the whole stack as local processes (the embedded default of `loom up`).

Each service runs in its own session, so its process group holds every process it spawns
(vLLM's EngineCore and workers included). Stopping signals the groups, not just the leaders:
SIGTERM, a grace period, then SIGKILL for whatever is left, so nothing outlives the supervisor
when it stops normally. (If the supervisor itself is SIGKILLed, its services keep running:
they are in their own sessions by design, so a Ctrl-C aimed at the terminal reaches only us.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType

import httpx2
import psutil

from services.common.service_token import token_environment
from services.common.settings import SERVICES, LoomSettings


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    argv: tuple[str, ...]
    startup_timeout_s: float = 60.0
    # An HTTP service is ready when its URL setting answers /readyz. A process without a port
    # (the Celery worker) is ready once it writes its pid to <data_dir>/run/<name>.ready.
    http: bool = True


def python_module(name: str, module: str, startup_timeout_s: float = 60.0,
                  http: bool = True) -> ServiceSpec:
    return ServiceSpec(name, (sys.executable, "-m", module), startup_timeout_s, http)


# Start order: the store first, the public entry last. They start side by side anyway; the
# rollout engine (vLLM: ~60-90 s on CPU) sets the pace.
STACK: tuple[ServiceSpec, ...] = (
    python_module("modelstate", "modelstate"),
    python_module("trainer", "services.trainer"),
    python_module("reward", "services.reward"),
    python_module("sandbox", "services.sandbox"),
    python_module("rollout", "services.rollout", startup_timeout_s=600.0),
    python_module("gateway", "gateway"),
    python_module("worker", "services.worker", http=False),  # waits for the gateway's schema
)


@dataclass
class RunningService:
    spec: ServiceSpec
    url: str
    log_path: Path
    process: subprocess.Popen[bytes]
    state: str = "starting"  # starting → ready → stopped | exited (died on its own)
    started_at: float = field(default_factory=time.monotonic)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class ServiceFailed(RuntimeError):
    def __init__(self, service: RunningService, reason: str) -> None:
        super().__init__(f"{service.name} {reason}")
        self.service = service
        self.reason = reason


class Supervisor:
    """Starts services, waits for their readiness, and stops them all (used as a context
    manager, so an error or Ctrl-C on the way still stops everything)."""

    def __init__(self, settings: LoomSettings, specs: Sequence[ServiceSpec] = STACK,
                 grace_s: float = 20.0, extra_env: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self.specs = tuple(specs)
        self.grace_s = grace_s
        self.extra_env = dict(extra_env or {})
        self.services: list[RunningService] = []
        self.log_dir = settings.data_dir / "logs"

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def environment(self) -> dict[str, str]:
        """Every service sees the same data dir, every other service's URL and the same
        service token (created here, before the services start)."""
        env = {**os.environ, "LOOM_DATA_DIR": str(self.settings.ensure_data_dir()),
               "PYTHONUNBUFFERED": "1"}
        env.update({f"LOOM_{name.upper()}_URL": self.settings.url_of(name) for name in SERVICES})
        env.update(token_environment(self.settings))
        if self.settings.database_url:
            env["LOOM_DATABASE_URL"] = self.settings.database_url
        env.update(self.extra_env)
        return env

    def launch(self) -> list[RunningService]:
        env = self.environment()  # first: it creates the data dir, private
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for spec in self.specs:
            log_path = self.log_dir / f"{spec.name}.log"
            with open(log_path, "ab") as log:
                log.write(f"\n--- loom: starting {spec.name} at {time.ctime()} ---\n".encode())
                log.flush()
                process = subprocess.Popen(
                    spec.argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True,
                )
            url = self.settings.url_of(spec.name) if spec.http else ""
            self.services.append(RunningService(spec, url, log_path, process))
        return self.services

    def wait_ready(self, on_change: Callable[[RunningService], None] | None = None,
                   poll_s: float = 0.5) -> None:
        """Block until every service answers /readyz; raise `ServiceFailed` if one exits or
        takes longer than its start-up timeout."""
        with httpx2.Client(timeout=2.0) as http:
            while pending := [s for s in self.services if s.state == "starting"]:
                for service in pending:
                    self._check_start(service, http)
                    if service.state != "starting" and on_change:
                        on_change(service)
                time.sleep(poll_s)

    def _check_start(self, service: RunningService, http: httpx2.Client) -> None:
        code = service.process.poll()
        if code is not None:
            service.state = "exited"
            raise ServiceFailed(service, f"exited with code {code} during start-up")
        limit = service.spec.startup_timeout_s
        if time.monotonic() - service.started_at > limit:
            raise ServiceFailed(service, f"was not ready after {limit:.0f} s")
        if not service.spec.http:
            if self._wrote_ready_file(service):
                service.state = "ready"
            return
        with contextlib.suppress(httpx2.TransportError):
            if http.get(f"{service.url}/readyz").status_code == 200:
                service.state = "ready"

    def _wrote_ready_file(self, service: RunningService) -> bool:
        try:
            marker = (self.settings.data_dir / "run" / f"{service.name}.ready").read_text()
        except OSError:
            return False
        return marker.strip() == str(service.pid)

    def start(self, on_change: Callable[[RunningService], None] | None = None
              ) -> list[RunningService]:
        self.launch()
        self.wait_ready(on_change)
        return self.services

    def first_exited(self) -> RunningService | None:
        """A service that died on its own since start-up, if any."""
        for service in self.services:
            if service.state == "ready" and service.process.poll() is not None:
                service.state = "exited"
                return service
        return None

    def stop(self) -> None:
        """SIGTERM to every process group, a grace period, then SIGKILL; reap the leaders."""
        live = [s for s in self.services if s.state != "stopped"]
        for service in live:
            _signal_group(service.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and any(_group_alive(s) for s in live):
            time.sleep(0.1)
        for service in live:
            if _group_alive(service):
                _signal_group(service.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                service.process.wait(timeout=5)
            if service.state != "exited":
                service.state = "stopped"


def terminate_on_sigterm() -> None:
    """SIGTERM stops the stack like Ctrl-C does (the supervisor's context exit runs); without
    it, a SIGTERM ends the Python process at once and leaves every service running."""

    def handler(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _group_alive(service: RunningService) -> bool:
    service.process.poll()  # reap the leader, so a finished one stops counting
    return bool(group_members(service.pid))


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of a process group: zombies are dead already, and in a
    container nobody may ever reap orphaned ones."""
    members = []
    for process in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if (os.getpgid(process.pid) == pgid
                    and process.info["status"] != psutil.STATUS_ZOMBIE):
                members.append(process)
    return members
