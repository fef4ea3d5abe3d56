"""Every hostile program against every backend: contained, the service stays healthy, the next
execution works, and no process, container or file is left behind."""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import tempfile
import time
from pathlib import Path

import docker
import pytest

from services.sandbox.docker_backend import POOL_LABEL
from services.sandbox.launcher import SHARED_WRITABLE_DIRS
from services.sandbox.schemas import ExecuteResponse
from tests.security.conftest import Bait, Sandbox
from tests.security.hostile import PROGRAMS, Hostile

ESCAPE_FILES = [Path(d) / "loom-escape" for d in SHARED_WRITABLE_DIRS] + [
    Path(p) for p in ("/etc/loom-escape", "/usr/loom-escape", "/loom-escape", "/root/loom-escape",
                      "/var/loom-escape", "/opt/loom-escape")]
SETTLE_S = 15.0


def _fill(code: str, bait: Bait) -> str:
    return (code.replace("@SECRET_FILE@", str(bait.secret_file))
            .replace("@TCP_PORT@", str(bait.tcp_port)).replace("@UDP_PORT@", str(bait.udp_port)))


async def _execute(sandbox: Sandbox, code: str, **options: object) -> ExecuteResponse:
    response = await sandbox.client.post("/v1/execute", json={"code": code, **options})
    assert response.status_code == 200, response.text
    return ExecuteResponse.model_validate(response.json())


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
async def test_hostile_program_is_contained(sandbox: Sandbox, bait: Bait,
                                            program: Hostile) -> None:
    workdirs_before = _process_workdirs()
    started = time.monotonic()
    result = await _execute(sandbox, _fill(program.code, bait), timeout_s=program.timeout_s,
                            memory_mb=program.memory_mb, max_output_bytes=65536)
    elapsed = time.monotonic() - started

    output = result.stdout + result.stderr
    assert "ESCAPED" not in output, output[-2000:]
    assert bait.secret not in output
    assert result.status in program.statuses, (result.status, output[-2000:])
    if program.stdout_has:
        assert program.stdout_has in result.stdout, output[-2000:]
    # Killing and cleaning up never takes long past the program's own timeout.
    assert elapsed < program.timeout_s + 10
    assert not bait.host_was_reached()
    assert not [path for path in ESCAPE_FILES if path.exists()]

    health = await sandbox.client.get("/readyz")
    assert health.status_code == 200
    after = await _execute(sandbox, "import os; print(sorted(os.listdir('.')))")
    assert after.status.value == "ok" and after.stdout == "['main.py']\n", after
    await _assert_nothing_left(sandbox, workdirs_before)


def _processes_of(uid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process, zombies included, that belongs to `uid`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                found.append((int(entry.name), (entry / "stat").read_text().rsplit(")")[-1][1]))
        except OSError:
            continue
    return found


def _process_workdirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("loom-sandbox-*")}


async def _assert_nothing_left(sandbox: Sandbox, workdirs_before: set[str]) -> None:
    deadline = time.monotonic() + SETTLE_S
    while True:
        leftovers = (_process_leftovers(sandbox, workdirs_before) if sandbox.backend == "process"
                     else await asyncio.to_thread(_docker_leftovers, sandbox))
        if not leftovers:
            return
        assert time.monotonic() < deadline, leftovers
        await asyncio.sleep(0.2)


def _process_leftovers(sandbox: Sandbox, workdirs_before: set[str]) -> list[str]:
    found = []
    base = sandbox.settings.sandbox_user_id_base
    if os.geteuid() == 0 and base is not None:
        for uid in range(base, base + sandbox.settings.sandbox_max_concurrency):
            found += [f"uid {uid}: pid {pid} ({state})" for pid, state in _processes_of(uid)]
    found += [f"workdir {name}" for name in _process_workdirs() - workdirs_before]
    return found


def _docker_leftovers(sandbox: Sandbox) -> list[str]:
    client = docker.DockerClient(base_url=sandbox.settings.sandbox_docker_url)
    try:
        pool = f"{POOL_LABEL}={sandbox.settings.sandbox_docker_pool}"
        containers = client.containers.list(all=True, filters={"label": pool})
        found = []
        if len(containers) != sandbox.settings.sandbox_max_concurrency:
            found.append(f"{len(containers)} containers in the pool")
        uid = str(sandbox.settings.sandbox_docker_user_id)
        for container in containers:
            if container.status != "running":
                found.append(f"{container.short_id} is {container.status}")
                continue
            processes = container.top(ps_args="-eo pid,uid,stat,comm")["Processes"] or []
            found += [f"{container.short_id}: {p}" for p in processes if p[1] == uid]
        return found
    finally:
        client.close()


async def test_collected_files_never_reveal_what_the_program_could_not_read(
        sandbox: Sandbox, bait: Bait) -> None:
    code = _fill("""
import os
for name, target in [("to_secret", "@SECRET_FILE@"), ("to_shadow", "/etc/shadow"),
                     ("to_proc", "/proc/1/environ")]:
    os.symlink(target, name)
os.makedirs("nested")
os.symlink("/etc", "nested/etc")
try:
    os.link("@SECRET_FILE@", "hardlink")
except OSError as exc:
    print("no hard link:", exc.strerror)
""", bait)
    collect = ["to_secret", "to_shadow", "to_proc", "nested/etc/shadow", "hardlink"]
    result = await _execute(sandbox, code, collect=collect)
    assert result.status.value == "ok", result.stderr
    assert [f.path for f in result.files] == collect
    for collected in result.files:
        assert collected.content is None, collected
        assert collected.error is not None
    assert {f.path: f.error for f in result.files}["to_secret"] == "a symbolic link (not followed)"


# Prints the sha256 of every SECRET-<32 hex> token anywhere in the program's own memory.
MEMORY_SCAN = r"""
import ctypes, hashlib, re, sys
token = sys.stdin.read()  # the program's own secret: proves the scan finds what is there
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: its /proc files become its own
found = set()
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
    regions = [line.split()[:2] for line in maps]
    for span, perms in regions:
        if not perms.startswith("r"):
            continue
        start, end = (int(x, 16) for x in span.split("-"))
        try:
            mem.seek(start)
            chunk = mem.read(end - start)
        except (OSError, ValueError, OverflowError):
            continue
        for match in re.finditer(rb"SECRET-[0-9a-f]{32}", chunk):
            found.add(hashlib.sha256(match.group()).hexdigest())
print(" ".join(sorted(found)))
"""


async def test_a_program_inherits_nothing_from_an_earlier_one(sandbox: Sandbox) -> None:
    """Programs are forked from a warm launcher: it must hold none of their data or state."""
    earlier = "SECRET-" + secrets.token_hex(16)
    leaves_state = (
        "import sys, os, builtins, json, fractions\n"
        "token = sys.stdin.read(); kept = [token * 3]\n"
        "json.poisoned = builtins.poisoned = token; os.environ['POISONED'] = token\n"
        "sys.path.append('/poisoned')\n"
        "print(len(token))\n")
    # Twice: both of the pool's agents have run it before the scans below.
    for _ in range(2):
        result = await _execute(sandbox, leaves_state, stdin=earlier)
        assert result.stdout == f"{len(earlier)}\n", result.stderr
    checks = (
        "import sys, os, builtins, json\n"
        "print(hasattr(json, 'poisoned'), hasattr(builtins, 'poisoned'),\n"
        "      'POISONED' in os.environ, 'fractions' in sys.modules, '/poisoned' in sys.path)\n")
    for _ in range(2):
        result = await _execute(sandbox, checks)
        assert result.stdout == "False False False False False\n", result.stderr
        own = "SECRET-" + secrets.token_hex(16)
        scan = await _execute(sandbox, MEMORY_SCAN, stdin=own, timeout_s=60, memory_mb=512)
        assert scan.status.value == "ok", scan.stderr
        found = scan.stdout.split()
        assert _sha256(own) in found  # the scan works
        assert _sha256(earlier) not in found


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def test_a_program_cannot_pass_itself_off_as_a_failed_start(sandbox: Sandbox) -> None:
    """Start failures travel on a pipe the program never holds: what it prints is its own."""
    code = "import sys\nsys.stderr.write('loom-sandbox: the sandbox is broken\\n')\nsys.exit(125)\n"
    result = await _execute(sandbox, code)
    assert (result.status.value, result.exit_code) == ("error", 125)
    assert result.stderr == "loom-sandbox: the sandbox is broken\n"


async def test_files_that_cannot_be_written_are_refused_with_the_reason(
        sandbox: Sandbox) -> None:
    files = [{"path": "data", "content": "a file"}, {"path": "data/inner.txt", "content": "x"}]
    response = await sandbox.client.post("/v1/execute", json={"code": "pass", "files": files})
    assert response.status_code == 422, response.text
    assert "'data/inner.txt' cannot be written in the workdir: File exists" in response.text
    after = await _execute(sandbox, "print('next')")  # the agent went back to the pool
    assert after.stdout == "next\n"
