"""The compose files and Dockerfiles keep the promises the README makes about them (the stack
itself runs in tests/e2e/test_compose.py): one port published, healthchecks on every image,
the build order, host networking for every service in the test override."""

from __future__ import annotations

import os
import re
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import yaml

from services.common import healthcheck
from services.common.settings import LoomSettings

ROOT = Path(__file__).resolve().parents[2]
LOOM_SERVICES = {  # compose service -> (its Dockerfile directory, port)
    "gateway": ("gateway", 8000),
    "rollout": ("rollout-cpu", 8001),
    "reward": ("reward", 8002),
    "sandbox": ("sandbox-service", 8003),
    "trainer": ("trainer", 8004),
    "modelstate": ("modelstate", 8005),
    "worker": ("worker", None),
}


def load(name: str) -> dict:
    return yaml.safe_load((ROOT / name).read_text())


def test_only_the_gateway_is_published_and_every_loom_service_waits_for_its_image() -> None:
    services = load("docker-compose.yml")["services"]
    assert {name for name, spec in services.items() if "ports" in spec} == {"gateway"}
    for name, (directory, port) in LOOM_SERVICES.items():
        spec = services[name]
        assert spec["build"] == f"docker/{directory}", name
        assert spec["depends_on"]["loom"] == {"condition": "service_completed_successfully"}
        assert spec["depends_on"]["postgres"] == {"condition": "service_healthy"}
        if port is not None:
            assert spec["environment"][f"LOOM_{name.upper()}_URL"] == f"http://{name}:{port}"
    assert services["loom"]["build"]["dockerfile"] == "docker/loom/Dockerfile"
    images = [spec["image"] for spec in services.values() if "image" in spec]
    assert len(images) == len(set(images))


def test_every_loom_service_reads_the_service_token_the_one_shot_makes() -> None:
    services = load("docker-compose.yml")["services"]
    token_file = "/run/secrets/loom/service_token"
    for name in LOOM_SERVICES:
        spec = services[name]
        assert spec["environment"]["LOOM_SERVICE_TOKEN_FILE"] == token_file, name
        assert "service-token:/run/secrets/loom:ro" in spec["volumes"], name
        assert "LOOM_SERVICE_TOKEN" not in spec["environment"], name
    # The image's data dir (/data, owned by its non-root user) is the volume it is made in.
    maker = services["loom"]
    assert maker["volumes"] == ["service-token:/data"]
    assert "services.common.service_token import main" in maker["command"][-1]


@pytest.mark.parametrize("service", sorted(LOOM_SERVICES))
def test_each_service_image_adds_a_healthcheck_and_command_to_the_shared_image(
    service: str,
) -> None:
    directory, port = LOOM_SERVICES[service]
    dockerfile = (ROOT / "docker" / directory / "Dockerfile").read_text()
    assert re.search(r"^FROM \$\{LOOM_IMAGE\}$", dockerfile, re.M)
    assert f'"services.common.healthcheck", "{service}"' in dockerfile
    assert (f"EXPOSE {port}" in dockerfile) == (port is not None)
    assert "USER" not in dockerfile  # the shared image's non-root user stays


def test_the_shared_image_runs_as_a_non_root_user_on_a_chosen_base() -> None:
    dockerfile = (ROOT / "docker/loom/Dockerfile").read_text()
    assert "ARG BASE_IMAGE=" in dockerfile
    assert dockerfile.rstrip().splitlines()[-2:] == ["USER loom", "WORKDIR /home/loom"]


def test_the_host_network_override_covers_every_service_on_loopback_ports() -> None:
    base = load("docker-compose.yml")["services"]
    hostnet = load("docker/compose.hostnet.yml")["services"]
    assert set(hostnet) == set(base)
    assert all(spec["network_mode"] == "host" for spec in hostnet.values())
    for name in LOOM_SERVICES:
        urls = {k: v for k, v in hostnet[name]["environment"].items() if k.endswith("_URL")}
        assert urls and all("127.0.0.1" in url for url in urls.values()), name


def test_the_gpu_override_puts_rollout_and_trainer_on_the_cuda_image() -> None:
    gpu = load("docker/compose.gpu.yml")["services"]
    assert gpu["loom-gpu"]["build"]["args"]["LOOM_EXTRA"] == "gpu"
    assert gpu["rollout"]["build"] == "docker/rollout-gpu"
    assert gpu["trainer"]["build"]["args"]["LOOM_IMAGE"] == "loom-gpu:latest"
    for name in ("rollout", "trainer"):
        (device,) = gpu[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"]


class _Ready(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200 if self.path == "/readyz" else 404)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


def test_healthcheck_asks_the_service_url_and_the_worker_ready_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = HTTPServer(("127.0.0.1", 0), _Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        up = LoomSettings(reward_url=f"http://127.0.0.1:{server.server_port}")
        assert healthcheck.http_ready("reward", up)
    finally:
        server.shutdown()
        server.server_close()
    assert not healthcheck.http_ready("reward", up)  # nothing listens there now

    monkeypatch.setenv("LOOM_DATA_DIR", str(tmp_path))
    assert not healthcheck.worker_ready()  # no ready file yet
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "worker.ready").write_text(str(os.getpid()))
    assert healthcheck.worker_ready()
    (tmp_path / "run" / "worker.ready").write_text("999999999")  # no such process
    assert not healthcheck.worker_ready()
    assert healthcheck.main(["nonsense"]) == 2
