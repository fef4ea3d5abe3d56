"""Loom on a 2-node local Ray cluster (CPU), every service a Ray actor, the trainer's 2 ranks
in a placement group: the demo's GRPO recipe (shortened) runs while rollout scales 1→2→1 with a
client sampling through the gateway (no call lost, the two replicas on different nodes), then
the second node's processes are killed mid-job: its replica leaves the routing table within its
heartbeat window and the job completes, every version published once and in order. The
scenario (tests/support/ray_scenario.py) runs in a network namespace with only loopback, so Ray
can neither bind nor reach a non-loopback address."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import require

REPO = Path(__file__).resolve().parents[2]


def test_a_grpo_job_on_a_two_node_ray_cluster_survives_scaling_and_a_node_death(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    require(
        shutil.which("unshare") is not None and shutil.which("ip") is not None,
        "unshare and ip (util-linux, iproute2): the scenario's private loopback network",
    )
    scenario = (
        f"ip link set lo up && exec {sys.executable} -m tests.support.ray_scenario "
        f"{tmp_path} {tiny_model_dir}"
    )
    try:
        result = subprocess.run(
            ["unshare", "--net", "sh", "-c", scenario],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=1500,
        )
    finally:
        # A scenario that failed half-way can leave services (and vLLM engines) behind, which
        # would slow every later test: whatever still runs on this test's data dir goes.
        _kill_processes_with(f"LOOM_DATA_DIR={tmp_path / 'data'}".encode())
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    seen = json.loads(lines[-1]) if lines else {}
    assert result.returncode == 0, _failure(seen, result.stderr)
    print("\nray scenario:", json.dumps(seen))
    assert seen["node_addresses"] == ["127.0.0.1"]
    assert len(set(seen["replica_nodes"])) == 2 and seen["failures"] == []


def _failure(seen: dict, stderr: str) -> str:
    """The scenario's error first, then what it saw, then each log's tail."""
    logs = seen.pop("logs", {})
    parts = [
        seen.pop("error", "(no error recorded: the scenario's stderr follows)"),
        json.dumps(seen),
    ]
    parts += [f"--- {name}\n{tail}" for name, tail in logs.items()]
    return "\n".join([*parts, "--- stderr", stderr[-3000:]])


def _kill_processes_with(variable: bytes) -> None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if variable in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
