"""Every hostile program against every backend: contained, the service stays healthy, the next
execution works, and no process, container or file is left behind."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from pathlib import Path

import docker
import pytest

from services.sandbox.docker_backend import POOL_LABEL
from services.sandbox.schemas import ExecuteResponse
from tests.security.conftest import Bait, Sandbox
from tests.security.hostile import PROGRAMS, Hostile

ESCAPE_FILES = [
    Path(d) / "loom-escape"
    for d in (
        "/tmp",
        "/var/tmp",
        "/dev/shm",
        "/run/lock",
        "/etc",
        "/usr",
        "/",
        "/root",
        "/var",
        "/opt",
    )
]
SETTLE_S = 15.0


async def _execute(sandbox: Sandbox, code: str, **options: object) -> ExecuteResponse:
    response = await sandbox.client.post("/v1/execute", json={"code": code, **options})
    assert response.status_code == 200, response.text
    return ExecuteResponse.model_validate(response.json())


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
async def test_hostile_program_is_contained(sandbox: Sandbox, bait: Bait, program: Hostile) -> None:
    started = time.monotonic()
    result = await _execute(
        sandbox,
        bait.fill(program.code),
        timeout_s=program.timeout_s,
        memory_mb=program.memory_mb,
        max_output_bytes=65536,
    )
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
    await assert_nothing_left(sandbox)


def processes_of(uids: range) -> list[str]:
    """Every process, zombies included, whose real uid is in `uids`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit():
                fields = dict(
                    line.split(":", 1)
                    for line in (entry / "status").read_text().splitlines()
                    if ":" in line
                )
                uid = int(fields["Uid"].split()[0])
                if uid in uids:
                    found.append(f"uid {uid}: pid {entry.name} ({fields['State'].strip()})")
        except OSError:
            continue
    return found


async def assert_nothing_left(sandbox: Sandbox) -> None:
    """No program's process is left, and nothing but the pool's agents: no extra container
    or control group."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        leftovers = (
            _process_leftovers(sandbox)
            if sandbox.backend == "process"
            else await asyncio.to_thread(_docker_leftovers, sandbox)
        )
        if not leftovers:
            return
        assert time.monotonic() < deadline, leftovers
        await asyncio.sleep(0.2)


def _process_leftovers(sandbox: Sandbox) -> list[str]:
    backend = sandbox.app_state.backend  # type: ignore[attr-defined]
    uids = backend.describe()["uids"]  # None: not root, programs run as the service's uid
    found = processes_of(range(uids[0], uids[1] + 1)) if uids else []
    slots = backend.cgroups.slot_names() if backend.cgroups else []
    if backend.cgroups and len(slots) != sandbox.settings.sandbox_max_concurrency:
        found.append(f"control groups {slots} for {sandbox.settings.sandbox_max_concurrency} slots")
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
    sandbox: Sandbox, bait: Bait
) -> None:
    code = bait.fill("""
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
""")
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
        "print(len(token))\n"
    )
    # Twice: both of the pool's agents have run it before the scans below.
    for _ in range(2):
        result = await _execute(sandbox, leaves_state, stdin=earlier)
        assert result.stdout == f"{len(earlier)}\n", result.stderr
    checks = (
        "import sys, os, builtins, json\n"
        "print(hasattr(json, 'poisoned'), hasattr(builtins, 'poisoned'),\n"
        "      'POISONED' in os.environ, 'fractions' in sys.modules, '/poisoned' in sys.path)\n"
    )
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


async def test_files_that_cannot_be_written_are_refused_with_the_reason(sandbox: Sandbox) -> None:
    files = [{"path": "data", "content": "a file"}, {"path": "data/inner.txt", "content": "x"}]
    response = await sandbox.client.post("/v1/execute", json={"code": "pass", "files": files})
    assert response.status_code == 422, response.text
    assert "'data/inner.txt' cannot be written in the workdir: File exists" in response.text
    after = await _execute(sandbox, "print('next')")  # the agent went back to the pool
    assert after.stdout == "next\n"
