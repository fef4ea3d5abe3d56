"""Loom on a 2-node local Ray cluster, end to end: `python -m tests.support.ray_scenario
<work dir> <tiny model dir>`. Run it inside a network namespace that has only loopback
(tests/e2e/test_ray_cluster.py does, with `unshare --net`): Ray binds its servers to every
interface and advertises the machine's address, so there it can bind and reach 127.0.0.1 only.

The stack comes up with one rollout replica, scales to two (on different nodes), then back to
one, while a client samples through the gateway the whole time; no call may fail. Prints one
JSON line of what it saw; exits non-zero on the first broken expectation."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import httpx2

from cli.cluster import placement
from cli.cluster.placement import ClusterSpec
from services.common.ports import free_port
from services.common.settings import LoomSettings

NODE_START_TIMEOUT_S = 300  # a loaded 2-core machine


class RayNode:
    """`ray start --block` in its own session: stopping it ends that node's processes only."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "ray"),
                    "start",
                    "--block",
                    "--disable-usage-stats",
                    *args,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=20)
                break
            except subprocess.TimeoutExpired:
                continue
        # Ray's own processes stay in the group when `ray start` exits first.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)


class Sampler(threading.Thread):
    """Samples through the gateway until stopped; counts answers and failures."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__(daemon=True)
        self.client = httpx2.Client(
            base_url=url, timeout=120, headers={"Authorization": f"Bearer {key}"}
        )
        self.stopping = threading.Event()
        self.ok = 0
        self.failures: list[str] = []

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                response = self.client.post(
                    "/v1/rollout/sample",
                    json={"prompt_token_ids": [5, 6, 7, 8], "params": {"max_tokens": 8}},
                )
            except httpx2.HTTPError as exc:
                self.failures.append(repr(exc))
                continue
            if response.status_code == 200:
                self.ok += 1
            else:
                self.failures.append(f"{response.status_code} {response.text[:300]}")


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_for(check, what: str, timeout_s: float) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def replicas(url: str, key: str) -> list[dict]:
    response = httpx2.get(
        f"{url}/v1/rollout/replicas", timeout=10, headers={"Authorization": f"Bearer {key}"}
    )
    response.raise_for_status()
    return [r for r in response.json()["replicas"] if not r["static"]]


def main(work: Path, model_dir: Path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    # Ray's unix sockets live under its temp dir, and a socket path has at most 107 bytes.
    ray_dir = tempfile.mkdtemp(prefix="loom-ray-", dir="/tmp")
    slot = '--resources={"rollout_slot": 1}'  # one replica per node
    nodes = [
        RayNode(
            [
                "--head",
                f"--port={port}",
                "--num-cpus=2",
                slot,
                "--include-dashboard=false",
                f"--temp-dir={ray_dir}",
            ],
            work / "ray-head.log",
        )
    ]
    seen: dict[str, object] = {}
    try:
        wait_for(lambda: port_open(port), "the Ray head", NODE_START_TIMEOUT_S)
        nodes.append(RayNode([f"--address={address}", "--num-cpus=2", slot], work / "ray-node.log"))
        placement.connect(address)
        import ray

        wait_for(
            lambda: len([n for n in ray.nodes() if n["Alive"]]) == 2,
            "the second node",
            NODE_START_TIMEOUT_S,
        )
        seen["node_addresses"] = sorted({n["NodeManagerAddress"] for n in ray.nodes()})
        settings = LoomSettings(data_dir=work / "data")
        spec = ClusterSpec(
            settings,
            rollout_resources={"rollout_slot": 1},
            env={
                "LOOM_ROLLOUT_MODEL": str(model_dir),
                "LOOM_ROLLOUT_HEARTBEAT_S": "0.5",
                "LOOM_ROLLOUT_KV_CACHE_GIB": "1",
                # A heartbeat every 0.5 s keeps the test short; a busy 2-core machine delays some by
                # seconds, and a replica that flaps out of the table is not what is tested here.
                "LOOM_GATEWAY_REPLICA_MISSED_HEARTBEATS": "20",
            },
        )
        started = time.monotonic()
        urls = placement.up(spec, 1)
        seen["up_s"] = round(time.monotonic() - started, 1)
        gateway, key = urls["gateway"], (settings.data_dir / "admin_key").read_text().strip()
        wait_for(
            lambda: [r["ready"] for r in replicas(gateway, key)] == [True],
            "one registered replica",
            60,
        )

        sampler = Sampler(gateway, key)
        sampler.start()
        started = time.monotonic()
        placement.scale(spec, 2)
        wait_for(
            lambda: [r["ready"] for r in replicas(gateway, key)] == [True, True],
            "two registered replicas",
            300,
        )
        seen["scale_up_s"] = round(time.monotonic() - started, 1)
        rows = {row["name"]: row for row in placement.status()}
        seen["replica_nodes"] = [rows[n]["node_id"][:8] for n in placement.rollout_names()]
        assert len(set(seen["replica_nodes"])) == 2, f"replicas share a node: {rows}"
        time.sleep(3)  # both serve
        routed = {r["id"]: r["routed"] for r in replicas(gateway, key)}
        seen["routed_with_two"] = routed
        assert all(count > 0 for count in routed.values()), routed

        placement.scale(spec, 1)
        wait_for(lambda: len(replicas(gateway, key)) == 1, "one replica again", 60)
        time.sleep(2)
        sampler.stopping.set()
        sampler.join(timeout=150)
        seen.update(samples_ok=sampler.ok, failures=sampler.failures[:5])
        assert sampler.ok > 0 and not sampler.failures, sampler.failures[:5]
        placement.down(spec)
        seen["actors_after_down"] = placement.status()
        assert not seen["actors_after_down"]
    except BaseException:
        # What went wrong comes first in the test's failure message: the error, then the tail
        # of every node's and service's log.
        seen["error"] = traceback.format_exc()[-3000:]
        seen["logs"] = {
            path.name: path.read_text(errors="replace")[-1200:]
            for path in sorted(work.rglob("*.log"))
        }
        raise
    finally:
        print(json.dumps(seen), flush=True)
        # The driver leaves the cluster before the nodes stop: a driver whose GCS is gone waits
        # for it at exit, then ends the process with an error of its own.
        with contextlib.suppress(Exception):
            import ray

            ray.shutdown()
        for node in reversed(nodes):
            node.stop()
        shutil.rmtree(ray_dir, ignore_errors=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
