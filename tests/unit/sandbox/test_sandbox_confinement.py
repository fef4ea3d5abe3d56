"""The process backend's building blocks on their own: what it refuses to start without, uid
ranges, control-group discovery and the seccomp filter's shape."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from services.sandbox import seccomp
from services.sandbox.cgroups import CgroupError, Cgroups
from services.sandbox.process_backend import ProcessBackend
from services.sandbox.settings import SandboxSettings
from services.sandbox.uid_ranges import BLOCK, claim, sweep_abandoned


async def test_without_bubblewrap_the_service_does_not_start_and_says_how_to_get_it(
    tmp_path: Path,
) -> None:
    backend = ProcessBackend(
        SandboxSettings(sandbox_max_concurrency=1, sandbox_bwrap=str(tmp_path / "bwrap"))
    )
    with pytest.raises(RuntimeError, match="needs bubblewrap .*apt-get install bubblewrap"):
        await backend.start()


def test_uid_ranges_are_disjoint_while_held_and_free_once_released(tmp_path: Path) -> None:
    first = claim(tmp_path, 70000)
    second = claim(tmp_path, 70000)
    assert (first.start, second.start) == (70000, 70000 + BLOCK)
    assert second.uid(3) == 70000 + BLOCK + 3
    with pytest.raises(ValueError):
        second.uid(BLOCK)
    first.release()
    again = claim(tmp_path, 70000)
    assert again.start == 70000
    for held in (second, again):
        held.release()


def test_a_range_never_holds_the_docker_backends_program_uid(tmp_path: Path) -> None:
    """A claim kills whatever runs under its uids: the docker sandbox's programs run as
    LOOM_SANDBOX_DOCKER_USER_ID on the host (65432, in the third block from 61000)."""
    held = [claim(tmp_path, 61000, avoid=frozenset({65432})) for _ in range(3)]
    assert [r.start for r in held] == [61000, 61000 + BLOCK, 61000 + 3 * BLOCK]
    assert all(not r.start <= 65432 < r.start + BLOCK for r in held)
    for r in held:
        r.release()


def test_only_blocks_no_service_holds_are_swept(tmp_path: Path) -> None:
    held = claim(tmp_path, 70000)
    claim(tmp_path, 70000).release()  # a service that ended: its lock file stays, unheld
    cleaned: list[int] = []
    sweep_abandoned(tmp_path, cleaned.append)
    assert cleaned == [70000 + BLOCK]
    held.release()


def test_control_groups_name_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory io\n")
    with pytest.raises(CgroupError, match=r"lacks the controllers \['pids'\]"):
        Cgroups("test", root=tmp_path)
    (tmp_path / "cgroup.controllers").unlink()
    with pytest.raises(CgroupError, match="no cgroup v1 hierarchy at .*memory"):
        Cgroups("test", root=tmp_path)


@pytest.mark.skipif(not seccomp.supported(), reason="no filter for this architecture")
def test_the_seccomp_filter_checks_the_architecture_first_and_allows_by_default() -> None:
    program = seccomp.filter_bytes()
    instructions = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    assert instructions[0] == (seccomp.LD_ABS_W, 0, 0, seccomp.ARCH_OFFSET)
    assert instructions[1][3] == seccomp.AUDIT_ARCH[seccomp.machine()]
    returns = {k for code, _, _, k in instructions if code == seccomp.RET}
    assert returns == {
        seccomp.RET_ALLOW,
        seccomp.RET_KILL_PROCESS,
        seccomp.RET_ERRNO | 1,
        seccomp.RET_ERRNO | 38,
    }  # EPERM, ENOSYS
    assert len(instructions) < 64  # every jump fits BPF's 8-bit offsets


@pytest.mark.skipif(os.geteuid() != 0, reason="control groups need a root service")
async def test_the_service_reports_its_confinement_and_removes_its_groups() -> None:
    backend = ProcessBackend(SandboxSettings(sandbox_max_concurrency=2))
    await backend.start()
    detail = backend.describe()
    assert detail["bwrap"].startswith("bubblewrap") and detail["cgroup"] in ("v1", "v2")
    assert detail["isolated_uid"] and detail["uids"][1] - detail["uids"][0] == BLOCK - 1
    assert backend.cgroups is not None
    instances = backend.cgroups.instances
    assert backend.cgroups.slot_names() == ["slot-0", "slot-1"]
    await backend.aclose()
    assert not [d for d in instances if d.exists()]
