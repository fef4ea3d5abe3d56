"""The supervisor and `loom up` / `loom status` with real services as subprocesses, and the
promise that stopping leaves no process behind."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx2
import psutil
import pytest

from cli import supervisor as supervisor_module
from cli.supervisor import (
    ServiceFailed,
    ServiceSpec,
    Supervisor,
    group_members,
    supervised_state,
)
from services.common.ports import free_port
from services.common.service_token import SERVICE_TOKEN_HEADER
from services.common.settings import LoomSettings


def wait_until(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def answers(url: str) -> bool:
    try:
        return httpx2.get(url, timeout=1).status_code == 200
    except httpx2.TransportError:
        return False


def alive(pids: set[int]) -> set[int]:
    left = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.add(pid)
        except psutil.NoSuchProcess:
            pass
    return left


@pytest.fixture
def ports_env(tmp_path: Path) -> dict[str, str]:
    return {
        # No LOOM_SERVICE_TOKEN: `loom up` makes the token itself, as on a fresh machine.
        **{k: v for k, v in os.environ.items() if k != "LOOM_SERVICE_TOKEN"},
        "LOOM_DATA_DIR": str(tmp_path / "data"),
        "LOOM_GATEWAY_URL": f"http://127.0.0.1:{free_port()}",
        "LOOM_MODELSTATE_URL": f"http://127.0.0.1:{free_port()}",
        # Nothing listens there: `loom status` must report them unreachable.
        **{
            f"LOOM_{name}_URL": f"http://127.0.0.1:{free_port()}"
            for name in ("ROLLOUT", "REWARD", "SANDBOX", "TRAINER")
        },
    }


def test_loom_up_then_sigterm_leaves_no_process(ports_env: dict[str, str], tmp_path: Path) -> None:
    gateway_url = ports_env["LOOM_GATEWAY_URL"]
    loom = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "up", "--only", "gateway", "--only", "modelstate"],
        env={**ports_env, "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert loom.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(loom.stdout or ()), daemon=True)
    reader.start()
    try:
        # The CLI's own word that it is up (it prints the key just before): the services may
        # answer /readyz a moment before the supervisor's poll sees them.
        wait_until(lambda: any("Stack is up" in line for line in lines), 120, "loom up")
        services = loom_descendants(loom.pid)
        assert len(services) >= 2

        status = subprocess.run(
            [sys.executable, "-m", "cli.main", "status", "--url", gateway_url],
            env={**ports_env, "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 1, status.stdout + status.stderr  # degraded: 4 are absent
        assert "degraded" in status.stdout and "unreachable" in status.stdout
        assert "modelstate" in status.stdout

        # The token `loom up` made: private, and what the services it started ask for.
        data = tmp_path / "data"
        token_file = data / "service_token"
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        store = f"{ports_env['LOOM_MODELSTATE_URL']}/v1/store"
        assert httpx2.get(store, timeout=10).status_code == 401
        token = {SERVICE_TOKEN_HEADER: token_file.read_text().strip()}
        assert httpx2.get(store, headers=token, timeout=10).status_code == 200

        loom.send_signal(signal.SIGTERM)
        loom.wait(timeout=60)
        reader.join(timeout=10)
    finally:
        if loom.poll() is None:
            loom.kill()
    output = "".join(lines)
    assert loom.returncode == 0, output
    assert "bootstrap admin API key" in output and "Stopped." in output
    assert alive(services) == set(), f"orphans left: {alive(services)}"
    assert (tmp_path / "data" / "logs" / "gateway.log").exists()
    assert (tmp_path / "data" / "admin_key").exists()


def loom_descendants(pid: int) -> set[int]:
    """The services (and anything they spawned) under a `loom up` process. They run in their
    own sessions but are still its children."""
    return {child.pid for child in psutil.Process(pid).children(recursive=True)}


# A service that spawns a child ignoring SIGTERM (as a stuck engine worker would), then serves
# /readyz: stopping must escalate to SIGKILL and take the child too.
STUBBORN_SERVICE = textwrap.dedent("""
    import http.server, os, signal, subprocess, sys
    from urllib.parse import urlsplit
    subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
        def log_message(self, *args):
            pass
    port = urlsplit(os.environ["LOOM_REWARD_URL"]).port
    http.server.HTTPServer(("127.0.0.1", port), Ready).serve_forever()
""")


def test_stop_escalates_to_sigkill_for_the_whole_group(tmp_path: Path) -> None:
    settings = LoomSettings(data_dir=tmp_path, reward_url=f"http://127.0.0.1:{free_port()}")
    spec = ServiceSpec("reward", (sys.executable, "-c", STUBBORN_SERVICE), 30)
    with Supervisor(settings, [spec], grace_s=1.0) as supervisor:
        (service,) = supervisor.start()
        assert service.state == "ready"
        wait_until(lambda: len(group_members(service.pid)) == 2, 10, "the child process")
        members = {p.pid for p in group_members(service.pid)}
        started = time.monotonic()
    assert 1.0 <= time.monotonic() - started < 10
    assert alive(members) == set()
    assert group_members(service.pid) == []


def test_start_up_death_shows_its_log_and_stops_the_rest(tmp_path: Path) -> None:
    settings = LoomSettings(
        data_dir=tmp_path,
        reward_url=f"http://127.0.0.1:{free_port()}",
        sandbox_url=f"http://127.0.0.1:{free_port()}",
    )
    crashing = ServiceSpec(
        "sandbox",
        (sys.executable, "-c", "import sys; print('bad config: no sandbox'); sys.exit(3)"),
    )
    stubborn = ServiceSpec("reward", (sys.executable, "-c", STUBBORN_SERVICE))
    supervisor = Supervisor(settings, [stubborn, crashing], grace_s=1.0)
    with pytest.raises(ServiceFailed) as failure, supervisor:
        supervisor.start()
    assert failure.value.service.name == "sandbox"
    assert "exited with code 3" in str(failure.value)
    assert "bad config: no sandbox" in failure.value.service.log_tail()
    assert all(group_members(s.pid) == [] for s in supervisor.services)


# Answers /readyz on LOOM_REWARD_URL's port; with an argument, exits with code 7 after that
# many seconds.
READY_SERVICE = textwrap.dedent("""
    import http.server, os, sys, threading
    from urllib.parse import urlsplit
    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
        def log_message(self, *args):
            pass
    if len(sys.argv) > 1:
        threading.Timer(float(sys.argv[1]), lambda: os._exit(7)).start()
    port = urlsplit(os.environ["LOOM_REWARD_URL"]).port
    server = http.server.HTTPServer(("127.0.0.1", port), Ready)
    server.allow_reuse_address = True
    server.serve_forever()
""")


def supervise_until(supervisor: Supervisor, state: str, timeout: float) -> None:
    with httpx2.Client(timeout=1) as http:
        wait_until(
            lambda: (
                supervisor.supervise(http) is not None and supervisor.services[0].state == state
            ),
            timeout,
            state,
        )


def test_a_service_that_dies_is_restarted_and_status_shows_it(tmp_path: Path) -> None:
    settings = LoomSettings(data_dir=tmp_path, reward_url=f"http://127.0.0.1:{free_port()}")
    spec = ServiceSpec("reward", (sys.executable, "-c", READY_SERVICE), 30)
    with Supervisor(settings, [spec], grace_s=1.0) as supervisor:
        (service,) = supervisor.start()
        first_pid = service.pid
        os.killpg(first_pid, signal.SIGKILL)
        supervise_until(supervisor, "waiting", 10)
        assert "restarting in 1 s" in service.log_tail()
        supervise_until(supervisor, "ready", 30)
        assert service.pid != first_pid and service.restarts == 1
        assert service.last_exit == -signal.SIGKILL
        assert answers(f"{settings.reward_url}/readyz")
        recorded = supervised_state(settings)["reward"]
        assert (recorded["state"], recorded["restarts"], recorded["pid"]) == (
            "ready",
            1,
            service.pid,
        )
    assert supervised_state(settings)["reward"]["state"] == "stopped"
    assert group_members(service.pid) == []


def test_a_service_that_keeps_dying_stops_the_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(supervisor_module, "RESTART_BACKOFF_S", 0.1)
    monkeypatch.setattr(supervisor_module, "MAX_DEATHS", 3)
    settings = LoomSettings(data_dir=tmp_path, reward_url=f"http://127.0.0.1:{free_port()}")
    spec = ServiceSpec("reward", (sys.executable, "-c", READY_SERVICE, "1.0"), 30)
    with Supervisor(settings, [spec], grace_s=1.0) as supervisor:
        supervisor.start()
        with pytest.raises(ServiceFailed) as failure, httpx2.Client(timeout=1) as http:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                supervisor.supervise(http)
                time.sleep(0.1)
    assert "exited with code 7; it died 3 times" in str(failure.value)
    assert failure.value.service.restarts == 2
    assert supervised_state(settings)["reward"]["state"] == "exited"


def test_deaths_after_a_healthy_stretch_are_not_a_crash_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each death comes after the service was ready for HEALTHY_RUN_S: routine restarts, so the
    count starts again every time and the stack keeps going past MAX_DEATHS."""
    monkeypatch.setattr(supervisor_module, "RESTART_BACKOFF_S", 0.1)
    monkeypatch.setattr(supervisor_module, "MAX_DEATHS", 2)
    monkeypatch.setattr(supervisor_module, "HEALTHY_RUN_S", 0.5)
    settings = LoomSettings(data_dir=tmp_path, reward_url=f"http://127.0.0.1:{free_port()}")
    # Lives 4 s from its start: ready well over HEALTHY_RUN_S before it dies, even when slow.
    spec = ServiceSpec("reward", (sys.executable, "-c", READY_SERVICE, "4.0"), 30)
    with Supervisor(settings, [spec], grace_s=1.0) as supervisor, httpx2.Client(timeout=1) as http:
        (service,) = supervisor.start()
        deadline = time.monotonic() + 120
        while service.restarts < 3 and time.monotonic() < deadline:
            supervisor.supervise(http)  # would raise ServiceFailed at the second death
            time.sleep(0.1)
        assert service.restarts >= 3
        assert len(service.deaths) == 1
