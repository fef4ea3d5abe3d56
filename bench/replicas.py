"""Rollout replicas behind the gateway: generation tokens/s with 2 replicas against 1, and the
gateway's routing cost per call.

Two real rollout replicas (processes, the tiny model; each engine's OMP thread on a core of its
own by LOOM_ROLLOUT_CPU_CORES_PER_REPLICA=1, as replicas on separate GPUs) register with a real
gateway process. Both arms run in the same run on the same replicas, round by round:
- **1 replica**: every call carries one `X-Loom-Affinity` key, so all go to one replica;
- **2 replicas**: no key, so least outstanding work spreads them.
Each round sends `--concurrency` sample calls at once, `--batches` times; tokens/s = completion
tokens returned / wall time. Routing cost: `--calls` sequential `POST /v1/rollout/tokenize`
(no engine work) through the gateway and straight to a replica, alternating; p50/p99 of each
and of the difference. Fan-out of version files between replicas: bench/fanout.py.
Writes bench/results/replicas.md.

    .venv/bin/python -m bench.replicas [--rounds 3] [--concurrency 16] [--batches 3]
        [--max-tokens 64] [--calls 300]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2

from services.common.base_models import ensure_tiny_model
from services.common.ports import free_port
from services.common.service_token import SERVICE_TOKEN_HEADER, service_token
from services.common.settings import LoomSettings
from services.rollout.cpu_cores import format_cores
from tests.support.rollout_process import RolloutProcess

RESULTS = Path(__file__).parent / "results" / "replicas.md"
READY_TIMEOUT_S = 600


def start_gateway(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    url = f"http://127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "LOOM_DATA_DIR": str(data_dir),
        "LOOM_GATEWAY_URL": url,
        "LOOM_ROLLOUT_URL": f"http://127.0.0.1:{free_port()}",
    }  # no static replica
    log = (data_dir / "gateway.log").open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return process, url


async def wait_ready(client: httpx2.AsyncClient, replicas: int) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            response = await client.get("/v1/rollout/replicas")
            table = response.json()["replicas"] if response.status_code == 200 else []
        except httpx2.TransportError:
            table = []
        if sum(r["ready"] and not r["static"] for r in table) == replicas:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"replicas not ready: {table}")
        await asyncio.sleep(1)


async def generation(
    client: httpx2.AsyncClient, args: argparse.Namespace, affinity: str | None, seed: int
) -> tuple[int, float]:
    headers = {"X-Loom-Affinity": affinity} if affinity else {}

    async def one(index: int) -> int:
        response = await client.post(
            "/v1/rollout/sample",
            headers=headers,
            json={
                "prompt_token_ids": [5 + index % 50, 6, 7, 8, 9, 10, 11, 12],
                "params": {"max_tokens": args.max_tokens, "seed": seed + index},
            },
        )
        response.raise_for_status()
        return sum(len(s["token_ids"]) for s in response.json()["samples"])

    started = time.perf_counter()
    tokens = 0
    for batch in range(args.batches):
        counts = await asyncio.gather(
            *(one(batch * args.concurrency + i) for i in range(args.concurrency))
        )
        tokens += sum(counts)
    return tokens, time.perf_counter() - started


async def routing_cost(
    gateway: httpx2.AsyncClient, direct: httpx2.AsyncClient, calls: int
) -> tuple[list[float], list[float]]:
    body = {"texts": ["12 + 7 ="]}
    via, straight = [], []
    for _ in range(calls):
        for client, path, out in (
            (gateway, "/v1/rollout/tokenize", via),
            (direct, "/v1/tokenize", straight),
        ):
            started = time.perf_counter()
            response = await client.post(path, json=body)
            out.append((time.perf_counter() - started) * 1e3)
            response.raise_for_status()
    return via, straight


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(args: argparse.Namespace, work: Path) -> str:
    model = ensure_tiny_model(work / "tiny")
    data_dir = work / "data"
    data_dir.mkdir()
    settings = LoomSettings(data_dir=data_dir)
    load_before = os.getloadavg()[0]
    gateway_process, url = start_gateway(data_dir)
    # Each engine takes a core of its own as replicas on one host do (a core slot each).
    env = {
        "LOOM_ROLLOUT_CPU_CORES_PER_REPLICA": "1",
        "LOOM_ROLLOUT_CPU_SLOTS_DIR": str(work / "core-slots"),
    }
    replicas = [
        RolloutProcess(data_dir=data_dir, model_dir=model, gateway_url=url, env=env)
        for _ in range(2)
    ]
    try:
        for replica in replicas:
            replica.start()
        deadline = time.monotonic() + 60
        while not (data_dir / "admin_key").exists():
            assert time.monotonic() < deadline, "the gateway wrote no admin key"
            await asyncio.sleep(0.2)
        key = (data_dir / "admin_key").read_text().strip()
        async with (
            httpx2.AsyncClient(
                base_url=url, timeout=300, headers={"Authorization": f"Bearer {key}"}
            ) as client,
            httpx2.AsyncClient(
                base_url=replicas[0].url,
                timeout=300,
                headers={SERVICE_TOKEN_HEADER: service_token(settings)},
            ) as direct,
        ):
            await wait_ready(client, 2)
            bound = [replica.bound_cores() for replica in replicas]
            await generation(client, args, None, 10_000)  # warm-up: both replicas, all shapes
            arms: dict[str, list[tuple[int, float]]] = {"1 replica": [], "2 replicas": []}
            for round_index in range(args.rounds):
                order = ["1 replica", "2 replicas"][:: 1 if round_index % 2 == 0 else -1]
                for arm in order:
                    affinity = "one-replica" if arm == "1 replica" else None
                    arms[arm].append(await generation(client, args, affinity, round_index))
            via, straight = await routing_cost(client, direct, args.calls)
    finally:
        for replica in replicas:
            replica.stop()
        gateway_process.terminate()
        gateway_process.wait(timeout=30)
    return report(args, arms, via, straight, (load_before, os.getloadavg()[0]), bound)


def report(
    args: argparse.Namespace,
    arms: dict[str, list[tuple[int, float]]],
    via: list[float],
    straight: list[float],
    load: tuple[float, float],
    bound: list[set[int]],
) -> str:
    rates = {arm: sum(t for t, _ in runs) / sum(s for _, s in runs) for arm, runs in arms.items()}
    added = [v - s for v, s in zip(via, straight, strict=True)]
    lines = [
        "# Rollout replicas through the gateway",
        "",
        f"`python -m bench.replicas --rounds {args.rounds} --concurrency {args.concurrency} "
        f"--batches {args.batches} --max-tokens {args.max_tokens} --calls {args.calls}` on "
        f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}). Two rollout "
        "replicas (tiny model), each engine's threads on a core slot of its own "
        "(LOOM_ROLLOUT_CPU_CORES_PER_REPLICA=1; bound, as read from /proc: "
        f"{' and '.join(format_cores(sorted(cores)) or 'none' for cores in bound)}); the "
        "gateway, the client and the replicas' Python processes share both cores with the "
        "engines. Both arms on the same replicas in the same run, alternating by round. "
        f"Load average (1 min) before / after: {load[0]:.1f} / {load[1]:.1f} "
        f"({_load_verdict(load[0])}).",
        "",
        "## Generation",
        "",
        "| arm | tokens | seconds | tokens/s |",
        "|---|---:|---:|---:|",
        *(
            f"| {arm} | {sum(t for t, _ in runs)} | {sum(s for _, s in runs):.1f} | "
            f"{rates[arm]:.0f} |"
            for arm, runs in arms.items()
        ),
        "",
        f"**2 replicas / 1 replica: {rates['2 replicas'] / rates['1 replica']:.2f}x** "
        "(target >= 1.8x with each engine on hardware of its own).",
        "",
        "## Routing cost per call (POST tokenize, sequential)",
        "",
        "| path | p50 ms | p99 ms |",
        "|---|---:|---:|",
        f"| through the gateway | {quantile(via, 0.5):.2f} | {quantile(via, 0.99):.2f} |",
        f"| straight to the replica | {quantile(straight, 0.5):.2f} | "
        f"{quantile(straight, 0.99):.2f} |",
        f"| added by the gateway (per call) | {quantile(added, 0.5):.2f} | "
        f"{quantile(added, 0.99):.2f} |",
        "",
        f"Mean added: {statistics.fmean(added):.2f} ms over {len(added)} calls (target: p50 "
        "<= 2 ms on loopback). The gateway's part includes API-key auth (cached), the "
        "routing decision, reading the body and a second HTTP hop.",
        "",
        "With one replica its engine has a core to itself while everything else shares the "
        "other; with two, the engines share both cores with the gateway, the client and the "
        "replicas' Python processes. The generation target needs each engine on hardware of "
        "its own (a GPU or a host each), which one 2-core machine cannot give. Fan-out of "
        "version files between replicas: bench/results/fanout.md.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loom-replicas-") as work:
        table = asyncio.run(measure(args, Path(work)))
    RESULTS.write_text(table)
    print(table)


def _load_verdict(before: float) -> str:
    """Whether other work shared the machine when the run began (the run's own processes
    raise the load after)."""
    if before >= (os.cpu_count() or 1) / 2:
        return "other work shared the cores: the numbers say little about the targets"
    return "the machine was quiet when the run began; the load after is the run's own"


if __name__ == "__main__":
    main()
