"""Run the whole stack as local processes (the embedded default of `loom up`).

Each service runs in its own session, so its process group holds every process it spawns
(vLLM's EngineCore and workers included). Stopping signals the groups, not just the leaders:
SIGTERM, a grace period, then SIGKILL for whatever is left, so nothing outlives the supervisor
when it stops normally. A service that dies once the stack is up is started again
(`supervise`), after a backoff that doubles with each death in a row, until it dies too often
in a row (MAX_DEATHS within DEATH_WINDOW_S, none of them after HEALTHY_RUN_S of being ready):
then the stack stops, as a crash loop would otherwise hide. Each service's state and restarts
are written to <data_dir>/run/supervisor.json, which `loom status` shows. (If the supervisor
itself is SIGKILLed, its services keep running: they are in their own sessions by design, so a
Ctrl-C aimed at the terminal reaches only us.)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
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


def python_module(
    name: str, module: str, startup_timeout_s: float = 60.0, http: bool = True
) -> ServiceSpec:
    return ServiceSpec(name, (sys.executable, "-m", module), startup_timeout_s, http)


# Start order: the store first, the public entry last. They start side by side anyway; the
# rollout engine (vLLM: ~60-90 s on CPU) sets the pace. A sharded trainer
# (LOOM_TRAINER_WORLD_SIZE > 1) answers only once its ranks have imported torch, formed their
# group and loaded the model: over 60 s on a loaded 2-core machine, hence the trainer's limit.
STACK: tuple[ServiceSpec, ...] = (
    python_module("modelstate", "modelstate"),
    python_module("trainer", "services.trainer", startup_timeout_s=300.0),
    python_module("reward", "services.reward"),
    python_module("sandbox", "services.sandbox"),
    python_module("rollout", "services.rollout", startup_timeout_s=600.0),
    python_module("gateway", "gateway"),
    python_module("worker", "services.worker", http=False),  # waits for the gateway's schema
)


# A death after start-up waits this long before the restart, doubled per death in a row.
RESTART_BACKOFF_S = 1.0
MAX_RESTART_BACKOFF_S = 30.0
MAX_DEATHS, DEATH_WINDOW_S = 5, 600.0
# Ready this long, a service has recovered: its next death starts the count again (six short
# outages an hour apart are routine restarts, not a crash loop).
HEALTHY_RUN_S = 120.0


@dataclass
class RunningService:
    spec: ServiceSpec
    url: str
    log_path: Path
    process: subprocess.Popen[bytes]
    # starting → ready → stopped | exited (died on its own) → waiting (to restart) → starting
    state: str = "starting"
    started_at: float = field(default_factory=time.monotonic)
    ready_at: float | None = None
    restarts: int = 0
    deaths: list[float] = field(default_factory=list)  # when it died (monotonic), recent ones
    restart_at: float = 0.0
    last_exit: int | None = None

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

    def __init__(
        self,
        settings: LoomSettings,
        specs: Sequence[ServiceSpec] = STACK,
        grace_s: float = 20.0,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.specs = tuple(specs)
        self.grace_s = grace_s
        self.extra_env = dict(extra_env or {})
        self.services: list[RunningService] = []
        self.log_dir = settings.data_dir / "logs"
        self._env: dict[str, str] = {}

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def environment(self) -> dict[str, str]:
        """Every service sees the same data dir, every other service's URL and the same
        service token (created here, before the services start)."""
        env = {
            **os.environ,
            "LOOM_DATA_DIR": str(self.settings.ensure_data_dir()),
            "PYTHONUNBUFFERED": "1",
        }
        env.update({f"LOOM_{name.upper()}_URL": self.settings.url_of(name) for name in SERVICES})
        env.update(token_environment(self.settings))
        if self.settings.database_url:
            env["LOOM_DATABASE_URL"] = self.settings.database_url
        env.update(self.extra_env)
        return env

    def launch(self) -> list[RunningService]:
        self._env = self.environment()  # first: it creates the data dir, private
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for spec in self.specs:
            log_path = self.log_dir / f"{spec.name}.log"
            url = self.settings.url_of(spec.name) if spec.http else ""
            self.services.append(RunningService(spec, url, log_path, self._spawn(spec, log_path)))
        self._write_state()
        return self.services

    def _spawn(
        self, spec: ServiceSpec, log_path: Path, why: str = "starting"
    ) -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as log:
            log.write(f"\n--- loom: {why} {spec.name} at {time.ctime()} ---\n".encode())
            log.flush()
            return subprocess.Popen(
                spec.argv,
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def supervise(self, http: httpx2.Client) -> list[RunningService]:
        """One round of keeping the stack up, for `loom up`'s loop: a service that died is
        started again after its backoff; one starting again is watched until ready (or dead
        again). Returns the services whose state changed. Raises `ServiceFailed` for a service
        that died MAX_DEATHS times within DEATH_WINDOW_S."""
        now = time.monotonic()
        changed = []
        for service in self.services:
            before = service.state
            if service.state in ("ready", "starting") and service.process.poll() is not None:
                self._died(service, now, f"exited with code {service.process.returncode}")
            elif (
                service.state == "starting"
                and now - service.started_at > service.spec.startup_timeout_s
            ):
                _signal_group(service.pid, signal.SIGKILL)
                service.process.wait()
                self._died(service, now, "was not ready in time after a restart")
            elif service.state == "starting" and self._answers(service, http):
                service.state, service.ready_at = "ready", now
            elif service.state == "waiting" and now >= service.restart_at:
                service.process = self._spawn(service.spec, service.log_path, "restarting")
                service.state, service.started_at = "starting", now
                service.restarts += 1
            if service.state != before:
                changed.append(service)
        if changed:
            self._write_state()
        return changed

    def _died(self, service: RunningService, now: float, reason: str) -> None:
        service.last_exit = service.process.returncode
        _signal_group(service.pid, signal.SIGKILL)  # what it spawned (vLLM's engine) goes too
        if service.ready_at is not None and now - service.ready_at >= HEALTHY_RUN_S:
            service.deaths.clear()
        service.ready_at = None
        service.deaths = [t for t in service.deaths if now - t < DEATH_WINDOW_S] + [now]
        if len(service.deaths) >= MAX_DEATHS:
            service.state = "exited"
            self._write_state()
            raise ServiceFailed(
                service,
                f"{reason}; it died {len(service.deaths)} times in "
                f"{DEATH_WINDOW_S / 60:.0f} minutes, so the stack stops",
            )
        backoff = min(MAX_RESTART_BACKOFF_S, RESTART_BACKOFF_S * 2 ** (len(service.deaths) - 1))
        service.state, service.restart_at = "waiting", now + backoff
        with open(service.log_path, "ab") as log:
            log.write(
                f"\n--- loom: {service.name} {reason}; restarting in {backoff:.0f} s ---\n".encode()
            )

    def _answers(self, service: RunningService, http: httpx2.Client) -> bool:
        if not service.spec.http:
            return self._wrote_ready_file(service)
        with contextlib.suppress(httpx2.TransportError):
            return http.get(f"{service.url}/readyz").status_code == 200
        return False

    @property
    def state_file(self) -> Path:
        return self.settings.data_dir / "run" / "supervisor.json"

    def _write_state(self) -> None:
        """What `loom status` shows of the supervised processes (atomic: a reader never sees
        half of it)."""
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        state = {
            s.name: {
                "state": s.state,
                "pid": s.pid,
                "restarts": s.restarts,
                "last_exit": s.last_exit,
                "log": str(s.log_path),
            }
            for s in self.services
        }
        partial = self.state_file.with_suffix(".tmp")
        partial.write_text(json.dumps(state, indent=1))
        partial.replace(self.state_file)

    def wait_ready(
        self, on_change: Callable[[RunningService], None] | None = None, poll_s: float = 0.5
    ) -> None:
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
        if self._answers(service, http):
            service.state, service.ready_at = "ready", time.monotonic()

    def _wrote_ready_file(self, service: RunningService) -> bool:
        try:
            marker = (self.settings.data_dir / "run" / f"{service.name}.ready").read_text()
        except OSError:
            return False
        return marker.strip() == str(service.pid)

    def start(
        self, on_change: Callable[[RunningService], None] | None = None
    ) -> list[RunningService]:
        self.launch()
        self.wait_ready(on_change)
        self._write_state()
        return self.services

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
        if self.services:
            self._write_state()


class SupervisionThread:
    """`supervise` rounds from a thread, for a stack run inside a test or a bench (`loom up`
    runs them in its main loop). A `ServiceFailed` ends them and is kept in `error`."""

    def __init__(self, supervisor: Supervisor, every_s: float = 0.2) -> None:
        self.supervisor = supervisor
        self.every_s = every_s
        self.error: ServiceFailed | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervise", daemon=True)

    def __enter__(self) -> SupervisionThread:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def service(self, name: str) -> RunningService:
        return next(s for s in self.supervisor.services if s.name == name)

    def _run(self) -> None:
        with httpx2.Client(timeout=1.0) as http:
            while not self._stop.wait(self.every_s):
                try:
                    self.supervisor.supervise(http)
                except ServiceFailed as failure:
                    self.error = failure
                    return


def supervised_state(settings: LoomSettings) -> dict[str, dict[str, object]]:
    """What a `loom up` over this data dir last wrote of its services ({} if none ran)."""
    try:
        state = json.loads((settings.data_dir / "run" / "supervisor.json").read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


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
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(process)
    return members
