"""The docker compose stack, built from a locally made base and run for real: every image
builds (docker/compose.offline.yml), every service turns healthy, `loom demo --url` completes
against it, sandbox and reward work across containers, and a restart loses nothing.

The stack runs on host networking (docker/compose.hostnet.yml) so the test talks to it on
127.0.0.1 only. Long (the first build installs Loom's dependencies into an image): it runs
only with LOOM_COMPOSE_TEST=1 or in CI, where a missing daemon or compose CLI is a failure.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
import yaml

from agents.sdk import LoomClient, ScoreItem
from tests.conftest import IN_CI, port_open, require

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not (IN_CI or os.environ.get("LOOM_COMPOSE_TEST") == "1"),
        reason="long: runs with LOOM_COMPOSE_TEST=1 or in CI",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "loomcomposetest"
FILES = ("docker-compose.yml", "docker/compose.offline.yml", "docker/compose.hostnet.yml")
GATEWAY = "http://127.0.0.1:18000"
HOST_PORTS = (15432, 16379, 18000, 18001, 18002, 18003, 18004, 18005)
LOOM_SERVICES = ("modelstate", "trainer", "rollout", "reward", "sandbox", "gateway", "worker")
SERVICE_AND_HEALTH = (
    '{{index .Config.Labels "com.docker.compose.service"}} {{if .State.Health}}'
    "{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}"
)
SANDBOX_POOL = "loom.sandbox.pool=loom-compose-sandbox"
BUILD_TIMEOUT_S = 2400
HEALTHY_TIMEOUT_S = 900


def compose_cli() -> list[str] | None:
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


class Compose:
    """The stack's compose project, on one file rendered from FILES without published ports
    (host networking publishes nothing, and compose refuses the combination; an override
    cannot remove a key in compose v1)."""

    def __init__(self, cli: list[str], api_key: str, workdir: Path) -> None:
        self.env = {**os.environ, "LOOM_API_KEY": api_key}
        files = [arg for name in FILES for arg in ("-f", str(ROOT / name))]
        rendered = yaml.safe_load(self.run([*cli, *files, "config"]).stdout)
        for service in rendered["services"].values():
            service.pop("ports", None)
        (workdir / "compose.yml").write_text(yaml.safe_dump(rendered))
        self.argv = [*cli, "--project-name", PROJECT, "-f", str(workdir / "compose.yml")]

    def run(
        self, argv: list[str], timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            argv, cwd=ROOT, env=self.env, text=True, capture_output=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv[-3:])} failed ({done.returncode}):\n"
                f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
            )
        return done

    def __call__(
        self, *args: str, timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.run([*self.argv, *args], timeout, check)

    def health(self) -> dict[str, str]:
        """Each service's health status (or its state, for one without a healthcheck)."""
        ids = self("ps", "-q").stdout.split()
        inspect = subprocess.run(
            ["docker", "inspect", "--format", SERVICE_AND_HEALTH, *ids],
            capture_output=True,
            text=True,
            check=True,
        )
        return dict(line.split(" ", 1) for line in inspect.stdout.splitlines())

    def wait_healthy(self, services: tuple[str, ...], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            health = self.health()
            unhealthy = {
                s: health.get(s, "missing") for s in services if health.get(s) != "healthy"
            }
            if not unhealthy:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not healthy after {timeout_s:.0f} s: {unhealthy}\n"
                    + self("logs", "--tail", "40", check=False).stdout[-8000:]
                )
            time.sleep(3)


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Compose]:
    require(
        subprocess.run(["docker", "info"], capture_output=True).returncode == 0, "a Docker daemon"
    )
    cli = compose_cli()
    require(cli is not None, "a docker compose CLI")
    assert cli is not None
    busy = [port for port in HOST_PORTS if port_open("127.0.0.1", port)]
    assert not busy, f"the compose test needs these loopback ports free: {busy}"
    subprocess.run(
        ["bash", str(ROOT / "docker/prepare-offline-build.sh")],
        check=True,
        env={**os.environ, "PIP": f"{Path(sys.executable).parent}/pip"},
    )
    stack = Compose(cli, secrets.token_hex(16), tmp_path_factory.mktemp("compose"))
    stack("down", "--volumes", "--remove-orphans", check=False)  # a run killed half-way
    try:
        stack("build", timeout=BUILD_TIMEOUT_S)
        stack("up", "-d", timeout=HEALTHY_TIMEOUT_S)
        stack.wait_healthy(("postgres", "redis", *LOOM_SERVICES), HEALTHY_TIMEOUT_S)
        yield stack
    finally:
        stack("down", "--volumes", "--remove-orphans", check=False)
    # The sandbox service removed its warm pool when it stopped.
    leftover = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={SANDBOX_POOL}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert not leftover, f"sandbox containers left behind: {leftover}"


def test_every_service_is_healthy_and_the_gateway_sees_them(compose: Compose) -> None:
    health = httpx2.get(
        f"{GATEWAY}/v1/health",
        timeout=10,
        headers={"Authorization": f"Bearer {compose.env['LOOM_API_KEY']}"},
    )
    assert health.status_code == 200, health.text
    body = health.json()
    assert body["status"] == "ok", body
    assert set(body["services"]) >= {"rollout", "reward", "sandbox", "trainer", "modelstate"}
    # A wrong key is refused: the stack runs with the admin key it was given, nothing else.
    assert (
        httpx2.get(
            f"{GATEWAY}/v1/health", timeout=10, headers={"Authorization": "Bearer nope"}
        ).status_code
        == 401
    )
    # Services run as the image's non-root user (the sandbox service holds the Docker socket
    # and runs as root by choice: see docker-compose.yml).
    for service in ("gateway", "modelstate", "trainer", "rollout", "reward", "worker"):
        uid = compose("exec", "-T", service, "id", "-u").stdout.strip()
        assert uid == "10001", (service, uid)


def test_sandbox_and_code_rewards_work_across_containers(compose: Compose) -> None:
    with LoomClient(GATEWAY, compose.env["LOOM_API_KEY"]) as loom:
        with loom.open_sandbox(job_id="compose") as sandbox:
            sandbox.execute("open('n.txt', 'w').write('41')")
            turn = sandbox.execute("print(int(open('n.txt').read()) + 1)")
            assert turn.stdout == "42\n", turn
        # The program cannot reach the network: sandboxes run with networking off.
        egress = loom.execute("import socket\nsocket.create_connection(('1.1.1.1', 53), 2)")
        assert egress.status == "error" and "Network is unreachable" in egress.stderr, egress
        loom.register_reward(
            "short",
            "def reward(response, reference):\n    return float(len(response) < 5)\n",
            job_id="compose",
        )
        scores = loom.score(
            "python",
            [ScoreItem(response="abc"), ScoreItem(response="abcdefg")],
            {"function": "short", "job_id": "compose"},
        ).scores
        assert [s.reward for s in scores] == [1.0, 0.0]


def test_loom_demo_completes_against_the_stack_and_survives_a_restart(
    compose: Compose, tmp_path: Path
) -> None:
    key = compose.env["LOOM_API_KEY"]
    demo = subprocess.run(
        [sys.executable, "-m", "cli.main", "demo", "--url", GATEWAY, "--out", str(tmp_path)],
        env={**os.environ, "LOOM_API_KEY": key},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert demo.returncode == 0, demo.stdout[-4000:] + demo.stderr[-4000:]
    assert "Demo finished" in demo.stdout
    assert list(tmp_path.glob("*.csv")) and list(tmp_path.glob("*.png"))
    job_id = re.search(r"Job (\S+): loom/tiny", demo.stdout)
    assert job_id, demo.stdout[-2000:]

    with LoomClient(GATEWAY, key) as loom:
        versions = [v.number for v in loom.get_job(job_id[1]).versions()]
    assert len(versions) > 2, versions
    # Rollout read every version in place from the shared blob volume: it downloaded nothing.
    cache = compose("exec", "-T", "rollout", "ls", "-A", "/data/rollout-cache", check=False)
    assert cache.stdout.strip() == "", cache.stdout

    compose("restart", "gateway", "modelstate", "rollout", timeout=300)
    compose.wait_healthy(("gateway", "modelstate", "rollout"), HEALTHY_TIMEOUT_S)
    with LoomClient(GATEWAY, key) as loom:
        again = loom.get_job(job_id[1])
        assert [v.number for v in again.versions()] == versions
        latest = again.sample("12+7=")
        assert latest.version == versions[-1]
