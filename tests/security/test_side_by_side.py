"""Two process-backend sandbox services on one host: disjoint uid ranges and control groups, so
neither one's programs nor its clean-up sweeps reach the other's programs or agents, and each
leaves nothing behind when it stops."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from pathlib import Path

import httpx2
import pytest

from services.sandbox.schemas import ExecuteResponse
from services.sandbox.schemas import ExecutionStatus as S
from tests.security.conftest import running_sandbox
from tests.security.test_hostile_programs import processes_of
from tests.support.sandboxes import sandbox_settings

# Kills every process it can see and may signal, over and over, then leaves a daemon behind
# for the clean-up sweep to find.
KILL_EVERYTHING = """
import os, signal, subprocess, time
for _ in range(20):
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass
    time.sleep(0.05)
subprocess.Popen(["sleep", "600"], start_new_session=True)
print("done")
"""
SLOW = "import time; time.sleep(2); print('survived')"


async def _execute(client: httpx2.AsyncClient, code: str) -> ExecuteResponse:
    response = await client.post("/v1/execute", json={"code": code, "timeout_s": 20})
    assert response.status_code == 200, response.text
    return ExecuteResponse.model_validate(response.json())


def _uids(state: object) -> range:
    first, last = state.backend.describe()["uids"]  # type: ignore[attr-defined]
    return range(first, last + 1)


@pytest.mark.skipif(os.geteuid() != 0, reason="uid ranges and control groups need root")
async def test_two_services_side_by_side_do_not_disturb_each_other() -> None:
    settings = [sandbox_settings("process", sandbox_max_concurrency=2) for _ in range(2)]
    assert settings[0].sandbox_user_id_base == settings[1].sandbox_user_id_base
    async with contextlib.AsyncExitStack() as stack_b:
        service_a = contextlib.AsyncExitStack()
        client_a, state_a = await service_a.enter_async_context(running_sandbox(settings[0]))
        try:
            client_b, state_b = await stack_b.enter_async_context(running_sandbox(settings[1]))
            uids_a, uids_b = _uids(state_a), _uids(state_b)
            assert not set(uids_a) & set(uids_b)
            groups = [
                s.backend.cgroups.instances  # type: ignore[attr-defined]
                for s in (state_a, state_b)
            ]
            assert not set(groups[0]) & set(groups[1])

            # A's programs attack while B's run, on every slot of both.
            results = await asyncio.gather(
                *(_execute(client_a, KILL_EVERYTHING) for _ in range(2)),
                *(_execute(client_b, SLOW) for _ in range(2)),
            )
            assert [r.stdout for r in results] == ["done\n"] * 2 + ["survived\n"] * 2, results

            # A stops (its agents die, its groups and uids are swept) while B is mid-program.
            slow = asyncio.ensure_future(_execute(client_b, SLOW))
            await asyncio.sleep(0.5)
        finally:
            await service_a.aclose()
        assert not processes_of(uids_a)
        assert (await slow).stdout == "survived\n"
        assert (await client_b.get("/readyz")).json()["detail"]["replaced"] == 0
        after = await _execute(client_b, "print('still here')")
        assert (after.status, after.stdout) == (S.ok, "still here\n")
    for uids, instances in ((uids_a, groups[0]), (uids_b, groups[1])):
        assert not processes_of(uids)
        assert not [d for d in instances if d.exists()]
        _assert_range_is_free(Path(settings[0].sandbox_lock_dir), uids.start)


def _assert_range_is_free(lock_dir: Path, start: int) -> None:
    fd = os.open(lock_dir / f"uids-{start}.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if a service still holds it
    finally:
        os.close(fd)
