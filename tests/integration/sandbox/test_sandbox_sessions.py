"""Stateful sessions over HTTP on both backends: files persist, processes do not, limits and
idle timeouts hold, and closing leaves nothing behind."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import httpx2
import pytest

from services.common.service_token import service_headers
from services.sandbox.app import create_app
from services.sandbox.docker_backend import POOL_LABEL
from services.sandbox.settings import SandboxSettings
from tests.support.sandboxes import BACKENDS, sandbox_settings

IDLE_S = 1.5


@pytest.fixture(params=BACKENDS)
async def service(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[httpx2.AsyncClient, SandboxSettings]]:
    settings = sandbox_settings(
        request.param,
        sandbox_max_concurrency=1,
        sandbox_max_sessions=3,
        sandbox_max_sessions_per_job=2,
        sandbox_session_idle_s=IDLE_S,
    )
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app),
            base_url="http://sandbox",
            timeout=60,
            headers=service_headers(settings),
        ) as client,
    ):
        yield client, settings


async def _open(client: httpx2.AsyncClient, job_id: str | None = None) -> str:
    response = await client.post("/v1/sessions", json={"job_id": job_id})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def _run(client: httpx2.AsyncClient, session: str, code: str) -> dict:
    response = await client.post(f"/v1/sessions/{session}/execute", json={"code": code})
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_files_persist_between_programs_and_processes_do_not(service) -> None:
    client, _ = service
    session = await _open(client, "job-a")
    first = await _run(
        client,
        session,
        """
import subprocess
open('notes.txt', 'w').write('turn 1')
child = subprocess.Popen(['sleep', '600'], start_new_session=True)
open('child.pid', 'w').write(str(child.pid))
""",
    )
    assert first["status"] == "ok", first["stderr"]
    second = await _run(
        client,
        session,
        """
import os
print(open('notes.txt').read())
try:
    os.kill(int(open('child.pid').read()), 0)
    print('child alive')
except ProcessLookupError:
    print('child gone')
""",
    )
    assert second["stdout"] == "turn 1\nchild gone\n", second

    one_shot = await client.post("/v1/execute", json={"code": "import os; print(os.listdir())"})
    assert one_shot.json()["stdout"] == "['main.py']\n"  # sessions do not leak into the pool


async def test_files_can_be_written_and_read(service) -> None:
    client, _ = service
    session = await _open(client)
    put = await client.put(
        f"/v1/sessions/{session}/files", json={"files": [{"path": "data/in.txt", "content": "3 4"}]}
    )
    assert put.status_code == 204
    ran = await _run(
        client,
        session,
        "a, b = map(int, open('data/in.txt').read().split())\n"
        "open('out.txt', 'w').write(str(a * b))",
    )
    assert ran["status"] == "ok", ran["stderr"]
    got = await client.get(
        f"/v1/sessions/{session}/files", params=[("path", "out.txt"), ("path", "nope")]
    )
    files = {f["path"]: f for f in got.json()["files"]}
    assert files["out.txt"]["content"] == "MTI=" and files["nope"]["error"] == "missing"
    bad = await client.get(f"/v1/sessions/{session}/files", params={"path": "../etc/passwd"})
    assert bad.status_code == 422
    too_big = await client.put(
        f"/v1/sessions/{session}/files",
        json={"files": [{"path": f"f{i}", "content": "x" * 6_000_000} for i in range(3)]},
    )
    assert too_big.status_code == 422 and "add up to more than" in too_big.text
    not_json = await client.put(
        f"/v1/sessions/{session}/files", content=b"{", headers={"content-type": "application/json"}
    )
    assert not_json.status_code == 422


async def test_limits_per_job_and_in_all(service) -> None:
    client, _ = service
    first, _second = await _open(client, "job-b"), await _open(client, "job-b")
    refused = await client.post("/v1/sessions", json={"job_id": "job-b"})
    assert refused.status_code == 429 and "limit per job" in refused.text
    await _open(client, "job-c")
    full = await client.post("/v1/sessions", json={"job_id": "job-d"})
    assert full.status_code == 429 and "in use" in full.text
    assert (await client.delete(f"/v1/sessions/{first}")).status_code == 204
    await _open(client, "job-b")  # closing freed a place for the job and in all


async def test_unknown_closed_and_idle_sessions_are_404(service) -> None:
    client, settings = service
    assert (await client.get("/v1/sessions/sbx_nope")).status_code == 404
    closed = await _open(client)
    await client.delete(f"/v1/sessions/{closed}")
    after = await client.post(f"/v1/sessions/{closed}/execute", json={"code": "pass"})
    assert after.status_code == 404 and "closed" in after.text

    idle = await _open(client)
    assert (await client.get(f"/v1/sessions/{idle}")).status_code == 200
    await asyncio.sleep(IDLE_S + 2.5)
    assert (await client.get(f"/v1/sessions/{idle}")).status_code == 404
    assert _session_leftovers(settings) == []


def _session_leftovers(settings: SandboxSettings) -> list[str]:
    if settings.sandbox_backend == "process":
        return [p.name for p in Path(tempfile.gettempdir()).glob("loom-sandbox-*")]
    client = docker.DockerClient(base_url=settings.sandbox_docker_url)
    try:
        label = f"{POOL_LABEL}={settings.sandbox_docker_pool}"
        containers = client.containers.list(all=True, filters={"label": label})
        return [c.short_id for c in containers][settings.sandbox_max_concurrency :]
    finally:
        client.close()
