"""Sandbox latency and throughput: both backends through the sandbox service over HTTP, against
a bare `python -c` subprocess (no isolation) in the same run.

For each of a trivial program and a 100 ms one, at concurrency 1, 8 and 32: p50/p99 latency
and executions per second, after a warm-up round. Writes bench/results/sandbox.md.

    .venv/bin/python -m bench.sandbox [--requests 200]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx2

from bench._stack import until_ready
from services.common.ports import free_port
from services.common.service_token import service_headers
from services.common.settings import LoomSettings

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "sandbox.md"
PROGRAMS = {"trivial": "pass", "100 ms": "import time\ntime.sleep(0.1)"}
CONCURRENCY = (1, 8, 32)
TARGET_P50_MS = {"process": 25.0, "docker": 60.0}
TARGET_TRIVIAL_PER_S = 100.0
# The interpreter sandboxed programs get (the process backend's first choice when the service's
# own Python is private to its user): the baseline must start the same one to be fair.
BARE_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


@dataclass
class Row:
    runner: str
    program: str
    concurrency: int
    latencies: list[float]
    wall_s: float
    failures: int

    def p(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def per_s(self) -> float:
        return len(self.latencies) / self.wall_s


Execute = Callable[[str], Awaitable[bool]]


async def measure(execute: Execute, code: str, concurrency: int, requests: int) -> Row:
    latencies: list[float] = []
    failures = 0
    queue = iter(range(requests))

    async def worker() -> None:
        nonlocal failures
        for _ in queue:
            started = time.perf_counter()
            ok = await execute(code)
            latencies.append(time.perf_counter() - started)
            failures += not ok

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Row("", "", concurrency, latencies, time.perf_counter() - started, failures)


async def bare_subprocess(code: str) -> bool:
    process = await asyncio.create_subprocess_exec(
        BARE_PYTHON, "-I", "-c", code, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    await process.communicate()
    return process.returncode == 0


@contextlib.asynccontextmanager
async def sandbox_service(backend: str, pool: int) -> AsyncIterator[Execute]:
    port = free_port()
    env = {
        **os.environ,
        "LOOM_SANDBOX_URL": f"http://127.0.0.1:{port}",
        "LOOM_SANDBOX_BACKEND": backend,
        "LOOM_SANDBOX_MAX_CONCURRENCY": str(pool),
        "LOOM_SANDBOX_DOCKER_POOL": f"loom-bench-{port}",
        "LOOM_LOG_LEVEL": "warning",
    }
    process = subprocess.Popen([sys.executable, "-m", "services.sandbox"], env=env, cwd=REPO)
    limits = httpx2.Limits(max_connections=64, max_keepalive_connections=64)
    # The service reads its token from the same environment (or data dir) as this process.
    async with httpx2.AsyncClient(
        base_url=f"http://127.0.0.1:{port}",
        timeout=120,
        limits=limits,
        headers=service_headers(LoomSettings()),
    ) as client:
        try:
            await until_ready(client, process, f"{backend} sandbox service", 120)

            async def execute(code: str) -> bool:
                response = await client.post("/v1/execute", json={"code": code})
                return response.status_code == 200 and response.json()["status"] == "ok"

            yield execute
        finally:
            process.terminate()
            process.wait(timeout=60)


async def run(requests: int) -> list[Row]:
    rows: list[Row] = []

    async def measure_all(runner: str, execute: Execute) -> None:
        for program, code in PROGRAMS.items():
            for concurrency in CONCURRENCY:
                await measure(execute, code, concurrency, min(requests, 4 * concurrency))  # warm
                row = await measure(execute, code, concurrency, max(requests, 2 * concurrency))
                row.runner, row.program = runner, program
                rows.append(row)
                print(
                    f"{runner:8} {program:8} c={concurrency:<3} p50 {row.p(0.5):7.1f} ms  "
                    f"p99 {row.p(0.99):7.1f} ms  {row.per_s:6.1f}/s  failures {row.failures}",
                    flush=True,
                )

    await measure_all("bare", bare_subprocess)
    for backend in ("process", "docker"):
        async with sandbox_service(backend, max(CONCURRENCY)) as execute:
            await measure_all(backend, execute)
    return rows


def report(rows: list[Row], requests: int) -> str:
    bare = {(r.program, r.concurrency): r for r in rows if r.runner == "bare"}
    lines = [
        f"# Sandbox: latency and throughput ({requests} executions per cell, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        "Machine: 2 CPU cores, no GPU. Each backend runs in the sandbox service "
        "(`python -m services.sandbox`, pool/slots = 32), called over HTTP on loopback with "
        f"httpx2; *bare* is `{BARE_PYTHON} -I -c` as an asyncio subprocess with no isolation, "
        "on the same machine in the same run. Warm: one warm-up round per cell before measuring. "
        "Latency is per request, client side; ratio = backend p50 / bare p50.",
        "",
        f"Targets: warm p50 at concurrency 1 ≤ {TARGET_P50_MS['process']:.0f} ms (process), "
        f"≤ {TARGET_P50_MS['docker']:.0f} ms (docker); ≥ {TARGET_TRIVIAL_PER_S:.0f} trivial "
        "executions per second (best concurrency).",
        "",
        "| runner | program | concurrency | p50 ms | p99 ms | executions/s | p50 vs bare | "
        "failures |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        baseline = bare[(row.program, row.concurrency)]
        lines.append(
            f"| {row.runner} | {row.program} | {row.concurrency} | {row.p(0.5):.1f} | "
            f"{row.p(0.99):.1f} | {row.per_s:.1f} | "
            f"{row.p(0.5) / baseline.p(0.5):.2f} | {row.failures} |"
        )
    lines += [
        "",
        "| backend | warm p50 trivial, c=1 (ms) | target | best trivial/s | target |",
        "|---|---|---|---|---|",
    ]
    for backend, target in TARGET_P50_MS.items():
        cells = [r for r in rows if r.runner == backend and r.program == "trivial"]
        p50 = next(r for r in cells if r.concurrency == 1).p(0.5)
        best = max(r.per_s for r in cells)
        lines.append(
            f"| {backend} | {p50:.1f} | {'PASS' if p50 <= target else 'FAIL'} "
            f"(≤ {target:.0f}) | {best:.1f} | "
            f"{'PASS' if best >= TARGET_TRIVIAL_PER_S else 'FAIL'} "
            f"(≥ {TARGET_TRIVIAL_PER_S:.0f}) |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    rows = asyncio.run(run(args.requests))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report(rows, args.requests))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
