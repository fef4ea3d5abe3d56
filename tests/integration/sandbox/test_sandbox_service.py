"""The sandbox service over HTTP: in-process through its app, and as a module."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

from services.common.ports import free_port
from services.common.service_token import service_headers
from services.common.settings import LoomSettings
from services.sandbox.app import create_app
from services.sandbox.schemas import ExecuteResponse
from tests.support.sandboxes import BACKENDS, sandbox_settings


@pytest.fixture(scope="module", params=BACKENDS)
async def client(request: pytest.FixtureRequest) -> AsyncIterator[httpx2.AsyncClient]:
    settings = sandbox_settings(request.param, sandbox_max_concurrency=2)
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app),
            base_url="http://sandbox",
            headers=service_headers(settings),
        ) as client,
    ):
        yield client


async def test_execute_runs_code(client: httpx2.AsyncClient) -> None:
    response = await client.post("/v1/execute", json={"code": "print(6 * 7)"})
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok" and body["stdout"] == "42\n"
    assert response.headers["x-request-id"]


async def test_readiness_describes_the_backend(
    client: httpx2.AsyncClient, request: pytest.FixtureRequest
) -> None:
    response = await client.get("/readyz")
    assert response.status_code == 200
    detail = response.json()["detail"]
    assert detail["backend"] == request.node.callspec.params["client"]
    assert detail["python_version"].startswith("3.")


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"code": ""},
        {"code": "print(1)", "timeout_s": 0},
        {"code": "print(1)", "timeout_s": 10_000},
        {"code": "print(1)", "memory_mb": 1},
        {"code": "print(1)", "language": "cobol"},
        {"code": "print(1)", "unexpected": True},
        {"code": 5},
    ],
)
async def test_malformed_requests_get_422(client: httpx2.AsyncClient, body: dict[str, Any]) -> None:
    response = await client.post("/v1/execute", json=body)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_input"


async def test_body_that_is_not_json_gets_422(client: httpx2.AsyncClient) -> None:
    response = await client.post(
        "/v1/execute", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422


def test_service_runs_as_a_module() -> None:
    port = free_port()
    env = {**os.environ, "LOOM_SANDBOX_URL": f"http://127.0.0.1:{port}"}
    process = subprocess.Popen(
        [sys.executable, "-m", "services.sandbox"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                response = httpx2.post(
                    f"http://127.0.0.1:{port}/v1/execute",
                    json={"code": "print('up')"},
                    timeout=30,
                    headers=service_headers(LoomSettings()),
                )
                break
            except httpx2.TransportError:
                assert process.poll() is None, process.stderr.read().decode()[-2000:]
                assert time.monotonic() < deadline, "sandbox service did not start"
                time.sleep(0.2)
        assert response.status_code == 200 and response.json()["stdout"] == "up\n"
    finally:
        process.terminate()
        process.wait(timeout=30)


async def test_files_go_in_and_come_back(client: httpx2.AsyncClient) -> None:
    code = (
        "import os\n"
        "data = open('in/numbers.txt').read().split()\n"
        "open('sum.txt', 'w').write(str(sum(map(int, data))))\n"
        "open('blob.bin', 'wb').write(open('raw.bin', 'rb').read()[::-1])\n"
        "os.symlink('/etc/hostname', 'link')\n"
        "os.mkdir('a_dir')\n"
    )
    response = await client.post(
        "/v1/execute",
        json={
            "code": code,
            "files": [
                {"path": "in/numbers.txt", "content": "1 2 3 4"},
                {"path": "raw.bin", "content": "AAEC", "encoding": "base64"},
            ],
            "collect": ["sum.txt", "blob.bin", "link", "a_dir", "nothing.txt"],
        },
    )
    assert response.status_code == 200, response.text
    body = ExecuteResponse.model_validate(response.json())
    assert body.status.value == "ok", body.stderr
    files = {f.path: f for f in body.files}
    assert files["sum.txt"].data() == b"10" and files["sum.txt"].size == 2
    assert files["blob.bin"].data() == b"\x02\x01\x00"
    assert files["link"].error == "a symbolic link (not followed)"
    assert files["a_dir"].error == "not a regular file"
    assert files["nothing.txt"].error == "missing"


async def test_bash_programs_run(client: httpx2.AsyncClient) -> None:
    response = await client.post(
        "/v1/execute",
        json={"language": "bash", "code": 'read name; echo "hi $name"; exit 3', "stdin": "loom\n"},
    )
    body = response.json()
    assert body["stdout"] == "hi loom\n" and body["exit_code"] == 3 and body["status"] == "error"


async def test_collect_stops_at_its_size_limit(client: httpx2.AsyncClient) -> None:
    code = "open('big', 'wb').write(b'x' * (17 * 2**20))\nopen('small', 'w').write('s')"
    response = await client.post("/v1/execute", json={"code": code, "collect": ["big", "small"]})
    files = {f["path"]: f for f in response.json()["files"]}
    assert files["big"]["error"].startswith("too large") and files["small"]["size"] == 1


@pytest.mark.parametrize(
    ("files", "collect", "message"),
    [
        ([{"path": "/etc/passwd", "content": "x"}], [], "relative to the workdir"),
        ([{"path": "../up", "content": "x"}], [], "inside the workdir"),
        ([{"path": "a/./b", "content": "x"}], [], "normalised"),
        ([{"path": "main.py", "content": "x"}], [], "program itself"),
        ([{"path": "x", "content": "not base64!", "encoding": "base64"}], [], "base64"),
        ([{"path": "x", "content": "1"}, {"path": "x", "content": "2"}], [], "same path"),
        ([], ["../../etc/shadow"], "inside the workdir"),
    ],
)
async def test_bad_file_requests_get_422(
    client: httpx2.AsyncClient, files: list[Any], collect: list[str], message: str
) -> None:
    response = await client.post(
        "/v1/execute", json={"code": "pass", "files": files, "collect": collect}
    )
    assert response.status_code == 422
    assert message in response.text


async def test_programs_import_the_files_they_bring(client: httpx2.AsyncClient) -> None:
    response = await client.post(
        "/v1/execute",
        json={
            "code": "import helper\nprint(helper.twice(21))",
            "files": [{"path": "helper.py", "content": "def twice(x):\n    return 2 * x\n"}],
        },
    )
    assert response.json()["stdout"] == "42\n"
