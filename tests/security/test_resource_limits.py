"""Limits that must hold for a program's whole process tree, not per process: memory, processes,
disk (through `collect` and through a session), CPU; plus links planted for the clean-up. On
every backend, through the HTTP API: each attack fails, the service stays healthy and nothing
is left behind."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path

from services.sandbox.process_backend import AGENT_MEMORY_MB
from services.sandbox.schemas import ExecuteResponse
from services.sandbox.schemas import ExecutionStatus as S
from tests.security.conftest import Sandbox
from tests.security.test_hostile_programs import assert_nothing_left

CHILD_MB = 400
MEMORY_ACROSS_CHILDREN = f"""
import subprocess, sys
child = "b = b'x' * ({CHILD_MB} << 20); print('allocated', flush=True); import time; time.sleep(5)"
children = [subprocess.Popen([sys.executable, "-c", child]) for _ in range(4)]
print("exit codes", [c.wait() for c in children])
"""
# A child that printed "allocated" may be OOM-killed later to make room for the next one, so the
# memory held at once is that of the children that lived through their sleep (exit code 0).
PROCESSES = """
import os, time
count = 0
try:
    while count < 10000:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        count += 1
except OSError as exc:
    print("fork failed:", exc.strerror)
print("processes", count)
"""
# Files of 4 MiB (under RLIMIT_FSIZE) until the disk says no; prints the MiB written.
FILL_WORKDIR = """
import os
written = 0
try:
    while True:
        with open(f"fill-{os.getpid()}-{written}", "wb") as fh:
            fh.write(b"x" * (4 << 20))
        written += 4
except OSError as exc:
    print("stopped:", exc.strerror)
print("written", written)
"""
FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
# While a fork bomb runs, a trivial program normally answers in ~20 ms; 2 s (the bound)
# leaves room for a loaded 2-core machine and still fails a service the bomb has starved.
LIVENESS_BOUND_S = 2.0


async def _execute(
    sandbox: Sandbox, code: str, path: str = "/v1/execute", **options: object
) -> ExecuteResponse:
    response = await sandbox.client.post(path, json={"code": code, **options})
    assert response.status_code == 200, response.text
    return ExecuteResponse.model_validate(response.json())


async def _assert_healthy(sandbox: Sandbox) -> None:
    assert (await sandbox.client.get("/readyz")).status_code == 200
    after = await _execute(sandbox, "import os; print(os.listdir('.'), os.listdir('/tmp'))")
    assert (after.status, after.stdout) == (S.ok, "['main.py'] []\n"), after
    await assert_nothing_left(sandbox)


def _memory_limit_mb(sandbox: Sandbox, memory_mb: int) -> int:
    """The most a program's process tree may hold: its `memory_mb` (and the agent's share) in
    the process backend's control group; the container's limit in docker."""
    if sandbox.backend == "process":
        return memory_mb + AGENT_MEMORY_MB
    return sandbox.settings.sandbox_docker_memory_mb


async def test_memory_is_limited_across_children(sandbox: Sandbox) -> None:
    result = await _execute(sandbox, MEMORY_ACROSS_CHILDREN, memory_mb=512, timeout_s=30)
    assert "exit codes" in result.stdout, result
    codes = result.stdout.split("exit codes")[-1].strip(" []\n").split(",")
    held = sum(int(code) == 0 for code in codes) * CHILD_MB
    # Each child alone fits its rlimit; four of them (1.6 GB) must not fit together.
    assert 0 < held <= _memory_limit_mb(sandbox, 512), result
    assert result.status in (S.ok, S.oom, S.killed, S.error), result
    await _assert_healthy(sandbox)


async def test_asking_for_more_memory_than_the_service_allows_is_refused(sandbox: Sandbox) -> None:
    response = await sandbox.client.post("/v1/execute", json={"code": "pass", "memory_mb": 16384})
    assert response.status_code == 422, response.text
    assert "memory_mb=16384 is above this sandbox's limit" in response.text
    await _assert_healthy(sandbox)


async def test_processes_are_limited_for_the_whole_tree(sandbox: Sandbox) -> None:
    result = await _execute(sandbox, PROCESSES, timeout_s=20)
    assert "fork failed" in result.stdout, result
    count = int(result.stdout.split("processes")[-1])
    assert 0 < count <= sandbox.settings.sandbox_max_processes, result
    await _assert_healthy(sandbox)


async def test_disk_through_collect_is_limited(sandbox: Sandbox) -> None:
    result = await _execute(sandbox, FILL_WORKDIR, collect=["missing"], timeout_s=30)
    assert result.status is S.ok, result
    assert "No space left on device" in result.stdout
    written = int(result.stdout.split("written")[-1])
    assert 0 < written <= sandbox.settings.sandbox_tmp_mb, result
    await _assert_healthy(sandbox)


async def test_disk_through_a_session_is_limited(sandbox: Sandbox) -> None:
    response = await sandbox.client.post("/v1/sessions", json={})
    assert response.status_code == 201, response.text
    session = f"/v1/sessions/{response.json()['id']}"
    try:
        written = 0
        for _ in range(3):  # the files stay: each program adds to what the last one left
            result = await _execute(sandbox, FILL_WORKDIR, f"{session}/execute", timeout_s=30)
            assert result.status is S.ok, result
            written += int(result.stdout.split("written")[-1])
        assert 0 < written <= sandbox.settings.sandbox_tmp_mb
    finally:
        assert (await sandbox.client.delete(session)).status_code == 204
    await _assert_healthy(sandbox)


async def test_a_fork_bomb_does_not_starve_the_service(sandbox: Sandbox) -> None:
    assert sandbox.settings.sandbox_max_concurrency >= 2  # room for the trivial program
    bomb = asyncio.ensure_future(_execute(sandbox, FORK_BOMB, timeout_s=8))
    await asyncio.sleep(2)  # the bomb holds every process and CPU it can get by now
    assert not bomb.done()
    started = time.monotonic()
    trivial = await _execute(sandbox, "print('alive')")
    answered_in = time.monotonic() - started
    assert (trivial.status, trivial.stdout) == (S.ok, "alive\n")
    assert answered_in < LIVENESS_BOUND_S
    assert (await bomb).status in (S.timeout, S.killed, S.error)
    await _assert_healthy(sandbox)


async def test_links_planted_for_the_clean_up_are_never_followed(sandbox: Sandbox) -> None:
    victim_dir = Path(tempfile.mkdtemp(prefix="loom-victim-"))
    victim = victim_dir / "precious.txt"
    victim.write_text("precious")
    victim.chmod(0o600)
    code = f"""
import os
targets = ["{victim_dir}", "{victim}", "/usr/lib", "/usr/bin/python3", "/proc/1/root", "/"]
for root in ("/work", "/tmp", "/dev/shm"):
    if not os.access(root, os.W_OK):
        continue
    os.makedirs(f"{{root}}/locked/inner")
    for n, target in enumerate(targets):
        os.symlink(target, f"{{root}}/link{{n}}")
        os.symlink(target, f"{{root}}/locked/inner/link{{n}}")
    os.chmod(f"{{root}}/locked/inner", 0)
    os.chmod(f"{{root}}/locked", 0)
print("planted")
"""
    try:
        result = await _execute(sandbox, code)
        assert (result.status, result.stdout) == (S.ok, "planted\n"), result
        await _assert_healthy(sandbox)
        assert victim.read_text() == "precious"
        assert (victim.stat().st_mode & 0o777, victim_dir.stat().st_mode & 0o777) == (0o600, 0o700)
        assert os.path.exists("/usr/lib") and os.access("/usr/bin/python3", os.X_OK)
    finally:
        victim.unlink()
        victim_dir.rmdir()
