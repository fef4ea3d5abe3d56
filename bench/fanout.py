"""Weight fan-out to rollout replicas: time from a version's publish returned to every replica
holding its files verified in its own cache, for 1, 2 and 4 replicas, 100 MB and 1 GB of
weights; the store's bytes served in each case.

Real parts, as processes: the gateway (replica table and fetch claims), the model-state store,
and N replicas. Each replica is `bench._fanout_replica`: the rollout service's own fan-out code
(`services.rollout.fanout.Fetcher`, its claims, the blob route, the heartbeat) without a vLLM
engine, with its own data and cache directory (`LOOM_ROLLOUT_STORE_LOCAL_READS` off: nothing
read in the store's directory, as on other hosts). Engine loading is not part of the time:
N engines holding 1 GB weights do not fit this machine; the files are what fan-out moves.
Two arms in the same run:
- **chain**: replicas claim the version at the gateway and fetch from each other
  (what rollout does);
- **store**: every replica fetches from the store (the baseline: no coordination).
The weights are one safetensors file of random bytes plus a small config.json.
Writes bench/results/fanout.md.

    flock /tmp/loom-vllm.lock .venv/bin/python -m bench.fanout [--replicas 1,2,4]
        [--sizes-mb 100,1000] [--arms chain,store] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2
import numpy as np
import psutil
from safetensors.numpy import save_file

from bench._stack import until_ready
from bench.replicas import start_gateway
from modelstate.client import ModelStateClient
from modelstate.schemas import VersionKind, VersionMeta
from services.common.ports import free_port
from services.common.service_token import SERVICE_TOKEN_HEADER

RESULTS = Path(__file__).parent / "results" / "fanout.md"
REGISTER_TIMEOUT_S = 120
FETCH_TIMEOUT_S = 900


def weights(directory: Path, size: int) -> Path:
    directory.mkdir(parents=True)
    data = np.frombuffer(np.random.default_rng(0).bytes(size), dtype=np.uint8)
    save_file({"weight": data}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text('{"model_type": "bench"}')
    return directory


def start(module: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", module],
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def registered(gateway: httpx2.AsyncClient, count: int) -> None:
    deadline = time.monotonic() + REGISTER_TIMEOUT_S
    while True:
        table = (await gateway.get("/v1/rollout/replicas")).json()["replicas"]
        if sum(not r["static"] for r in table) == count:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"replicas did not register: {table}")
        await asyncio.sleep(0.2)


async def done(logs: list[Path], processes: list[subprocess.Popen[bytes]]) -> list[dict]:
    deadline = time.monotonic() + FETCH_TIMEOUT_S
    while not all(log.exists() and log.read_text().strip() for log in logs):
        if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
            raise RuntimeError("a replica did not fetch the version (see its log)")
        await asyncio.sleep(0.05)
    return [json.loads(log.read_text().splitlines()[0]) for log in logs]


def cpu_seconds(processes: list[subprocess.Popen[bytes]]) -> float:
    return sum(sum(psutil.Process(p.pid).cpu_times()[:2]) for p in processes)


async def one_case(
    work: Path,
    urls: dict[str, str],
    gateway: httpx2.AsyncClient,
    store: ModelStateClient,
    source: Path,
    replicas: int,
    arm: str,
) -> dict:
    job = f"fanout-{arm}-{replicas}-{secrets.token_hex(3)}"
    case = work / job
    processes, logs = [], []
    for index in range(replicas):
        home = case / f"replica-{index}"  # its own data and cache: nothing shared
        home.mkdir(parents=True)
        logs.append(home / "done.jsonl")
        env = {
            "LOOM_DATA_DIR": str(home),
            "LOOM_ROLLOUT_URL": f"http://127.0.0.1:{free_port()}",
            "LOOM_ROLLOUT_CACHE_DIR": str(home / "cache"),
            "LOOM_ROLLOUT_HEARTBEAT_S": "0.5",
            "LOOM_GATEWAY_URL": urls["gateway"],
            "LOOM_MODELSTATE_URL": urls["modelstate"],
            "LOOM_BENCH_DONE_LOG": str(logs[-1]),
            "LOOM_BENCH_JOB": job,
            "LOOM_BENCH_PEERS": arm,
        }
        processes.append(start("bench._fanout_replica", env, home / "replica.log"))
    try:
        await registered(gateway, replicas)
        await asyncio.sleep(1.0)  # each has subscribed to the store's events
        cpu_before = cpu_seconds(processes)
        version = await store.publish(
            VersionMeta(job_id=job, kind=VersionKind.full, base_model="bench"), source
        )
        published = time.time()
        records = await done(logs, processes)
        cpu = cpu_seconds(processes) - cpu_before
    finally:
        for process in processes:
            stop(process)
        await registered(gateway, 0)
    seconds = max(r["done_at"] for r in records) - published
    shutil.rmtree(case)
    return {
        "replicas": replicas,
        "arm": arm,
        "seconds": seconds,
        "size": sum(f.size for f in version.files),
        "store_bytes": sum(r["bytes_from_store"] for r in records),
        "peer_bytes": sum(r["bytes_from_peers"] for r in records),
        "replica_cpu_s": cpu,
    }


async def measure(args: argparse.Namespace, work: Path) -> tuple[list[dict], str, str]:
    os.environ["LOOM_SERVICE_TOKEN"] = secrets.token_urlsafe(32)
    server = work / "server"
    server.mkdir()
    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    gateway_process, gateway_url = start_gateway(server)
    store_url = f"http://127.0.0.1:{free_port()}"
    store_process = start(
        "modelstate",
        {"LOOM_DATA_DIR": str(server), "LOOM_MODELSTATE_URL": store_url},
        server / "modelstate.log",
    )
    urls = {"gateway": gateway_url, "modelstate": store_url}
    token = {SERVICE_TOKEN_HEADER: os.environ["LOOM_SERVICE_TOKEN"]}
    store = ModelStateClient(store_url, headers=token)
    rows = []
    try:
        async with (
            httpx2.AsyncClient(base_url=store_url) as store_probe,
            httpx2.AsyncClient(base_url=gateway_url) as gateway_probe,
        ):
            await until_ready(store_probe, store_process, "store", 120)
            await until_ready(gateway_probe, gateway_process, "gateway", 120)
        key = (server / "admin_key").read_text().strip()
        async with httpx2.AsyncClient(
            base_url=gateway_url, headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as gateway:
            for size_mb in args.sizes_mb:
                source = weights(work / f"weights-{size_mb}", size_mb * 10**6)
                for _ in range(args.rounds):
                    for replicas in args.replicas:
                        for arm in args.arms:
                            row = await one_case(work, urls, gateway, store, source, replicas, arm)
                            print(row, flush=True)
                            rows.append(row)
                shutil.rmtree(source)
    finally:
        await store.aclose()
        stop(gateway_process)
        stop(store_process)
    uptime_after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return rows, uptime_before, uptime_after


def report(rows: list[dict], args: argparse.Namespace, uptimes: tuple[str, str]) -> str:
    def best(size: int, replicas: int, arm: str) -> dict:
        matching = [
            r for r in rows if r["size"] == size and r["replicas"] == replicas and r["arm"] == arm
        ]
        return min(matching, key=lambda r: r["seconds"])

    lines = [
        "# Weight fan-out to rollout replicas",
        "",
        "`python -m bench.fanout` "
        f"(replicas {args.replicas}, sizes {args.sizes_mb} MB, arms {args.arms}, "
        f"best of {args.rounds} round(s)), {platform.machine()}, {os.cpu_count()} cores.",
        "",
        "Time from `publish` returned to every replica holding the version's files verified "
        "(sha256) in its own cache directory. Replicas: the rollout service's fan-out code "
        "without a vLLM engine (bench/_fanout_replica.py), one process each, own data and "
        "cache directory, loopback HTTP, all on this one machine: they share its cores and "
        "disk, where replicas on separate hosts would not. Engine load time is not included "
        "(not measured here). Replica CPU: the replicas' CPU seconds (user + system) from "
        "just before the publish to the end, summed; the machine has "
        f"{os.cpu_count()} cores for all of them, the store and the gateway.",
        "",
        "| weights | replicas | arm | seconds | vs 1 replica | store bytes | peer bytes "
        "| replica CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for size in sorted({r["size"] for r in rows}):
        for arm in args.arms:
            one = best(size, 1, arm)["seconds"] if 1 in args.replicas else None
            for replicas in args.replicas:
                row = best(size, replicas, arm)
                ratio = f"{row['seconds'] / one:.2f}x" if one else "-"
                lines.append(
                    f"| {size / 1e6:.0f} MB | {replicas} | {arm} | {row['seconds']:.2f} | "
                    f"{ratio} | {row['store_bytes'] / 1e6:.0f} MB | "
                    f"{row['peer_bytes'] / 1e6:.0f} MB | {row['replica_cpu_s']:.1f} |"
                )
    lines += ["", f"Load before: `{uptimes[0]}`", f"Load after: `{uptimes[1]}`", ""]
    return "\n".join(lines)


def numbers(text: str) -> list[int]:
    return [int(n) for n in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--replicas", type=lambda s: [int(n) for n in s.split(",")], default=[1, 2, 4]
    )
    parser.add_argument(
        "--sizes-mb", type=lambda s: [int(n) for n in s.split(",")], default=[100, 1000]
    )
    parser.add_argument("--arms", type=lambda s: s.split(","), default=["chain", "store"])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loom-fanout-") as work:
        rows, *uptimes = asyncio.run(measure(args, Path(work)))
    text = report(rows, args, (uptimes[0], uptimes[1]))
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
