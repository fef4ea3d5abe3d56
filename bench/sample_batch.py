"""One GRPO step's sampling (issue 38): 16 prompts x 8 samples x 8 new tokens of the tiny model,
through the SDK, the gateway, the rollout service and its vLLM engine on the embedded stack,
sent three ways, interleaved call by call on one stack (the model: bench/vs_trl.py's start
checkpoint, the tiny model after its warm-up, with a 64 MiB KV cache; a full-weights job's
version 0; temperature 1):

- `per-prompt`: what `sample_many` did before: a `POST /v1/sample` per prompt, the first alone
  (it resolved the version), then the other 15 at once;
- `per-prompt, at once`: the same 16 requests, all at once;
- `batch`: `sample_many` now: one `POST /v1/sample/batch` with every prompt.

Per call: the client's wall; the gateway's and the rollout service's own request-latency
histograms (seconds summed over the call's requests: concurrent requests overlap); the seconds
the engine had a generation in flight (the rollout's busy clock). Then each service's resident
memory at rest (its process and every process it started). Appends to
bench/results/sample_batch.md.

    .venv/bin/python -m bench.sample_batch [--rounds 5] [--calls 4] [--start DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import psutil

from agents.sdk import AsyncJobClient, AsyncLoomClient, SamplingParams
from bench._stack import LocalStack, local_stack
from bench._vs_trl_task import build_start, splits
from services.rollout.schemas import SampleRequest, SampleResponse

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "sample_batch.md"
PROMPTS, GROUP, MAX_TOKENS = 16, 8, 8
PARAMS = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0)
Arm = Callable[[AsyncLoomClient, AsyncJobClient, list[str]], Awaitable[list[SampleResponse]]]


async def per_prompt(loom: AsyncLoomClient, job: AsyncJobClient, prompts: list[str]) -> list:
    first = await loom.sample(request(job, prompts[0]))
    rest = await asyncio.gather(*(loom.sample(request(job, p)) for p in prompts[1:]))
    return [first, *rest]


async def at_once(loom: AsyncLoomClient, job: AsyncJobClient, prompts: list[str]) -> list:
    return list(await asyncio.gather(*(loom.sample(request(job, p)) for p in prompts)))


async def batch(_loom: AsyncLoomClient, job: AsyncJobClient, prompts: list[str]) -> list:
    return await job.sample_many(prompts, n=GROUP, params=PARAMS, version=0)


def request(job: AsyncJobClient, prompt: str) -> SampleRequest:
    return SampleRequest(job_id=job.id, version=0, prompt=prompt, n=GROUP, params=PARAMS)


ARMS: dict[str, Arm] = {"per-prompt": per_prompt, "per-prompt, at once": at_once, "batch": batch}
# The rollout routes each arm uses, and the gateway's proxy route.
ROLLOUT_ROUTES = ("/v1/sample", "/v1/sample/batch")


def histogram_sum(text: str, routes: tuple[str, ...]) -> float:
    """Seconds summed in `loom_http_request_seconds` over `routes` (any method)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("loom_http_request_seconds_sum") and any(
            f'route="{route}"' in line for route in routes
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Probe:
    """The services' own clocks, read before and after a call."""

    def __init__(self, stack: LocalStack) -> None:
        import httpx2

        self.stack = stack
        self.http = httpx2.Client(timeout=10)

    def read(self) -> tuple[float, float, float]:
        gateway = self.http.get(f"{self.stack.settings.gateway_url}/metrics").text
        rollout = self.http.get(f"{self.stack.settings.url_of('rollout')}/metrics").text
        busy = self.stack.counter("rollout", "loom_rollout_engine_busy_seconds_total")
        return (
            histogram_sum(gateway, ("/v1/{service}/{path:path}",)),
            histogram_sum(rollout, ROLLOUT_ROUTES),
            busy,
        )


async def measure(stack: LocalStack, start: Path, rounds: int, calls: int) -> dict[str, dict]:
    train, _, _ = splits()
    rng = random.Random(0)
    probe = Probe(stack)
    seen: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    async with AsyncLoomClient(stack.settings.gateway_url, stack.api_key) as loom:
        job = await loom.create_job(str(start), name="sample-batch", mode="full")
        for arm in ARMS.values():  # warm-up
            await arm(loom, job, [p.prompt for p in rng.sample(train, PROMPTS)])
        for round_ in range(rounds):
            names = list(ARMS) if round_ % 2 == 0 else list(ARMS)[::-1]
            for _ in range(calls):
                for name in names:
                    prompts = [p.prompt for p in rng.sample(train, PROMPTS)]
                    before = probe.read()
                    began = time.perf_counter()
                    responses = await ARMS[name](loom, job, prompts)
                    wall = time.perf_counter() - began
                    after = probe.read()
                    row = seen[name]
                    row["wall"].append(wall)
                    for key, a, b in zip(
                        ("gateway", "rollout", "engine"), before, after, strict=True
                    ):
                        row[key].append(b - a)
                    row["tokens"].append(
                        statistics.mean(len(s.token_ids) for r in responses for s in r.samples)
                    )
        await job.finish()
    return seen


def memory(stack: LocalStack) -> list[tuple[str, str, int]]:
    """(service, process, RSS bytes) of every service process and each process it started."""
    rows = []
    for service in stack.supervisor.services:
        root = psutil.Process(service.pid)
        for process in [root, *root.children(recursive=True)]:
            try:
                rows.append((service.name, process.name(), process.memory_info().rss))
            except psutil.Error:
                continue
    return rows


def report(
    seen: dict[str, dict],
    rss: list[tuple[str, str, int]],
    args: argparse.Namespace,
    load: tuple[str, str],
    began: datetime,
) -> str:
    base = statistics.median(seen["per-prompt"]["wall"])
    lines = [
        f"## {args.rounds} rounds x {args.calls} calls per arm, {began:%Y-%m-%d %H:%M} UTC",
        "",
        f"`uptime` before: {load[0]}; after: {load[1]} (a shared 2-core machine: times are "
        "upper bounds). Medians per call; gateway and rollout: the service's own "
        "request-latency histogram, summed over the call's requests.",
        "",
        "| arm | wall ms | × per-prompt | gateway ms (summed) | rollout ms (summed) | "
        "engine busy ms | tokens/sample |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in seen.items():
        wall = statistics.median(row["wall"])
        lines.append(
            f"| {name} | {wall * 1e3:.0f} | {wall / base:.2f}× | "
            f"{statistics.median(row['gateway']) * 1e3:.0f} | "
            f"{statistics.median(row['rollout']) * 1e3:.0f} | "
            f"{statistics.median(row['engine']) * 1e3:.0f} | "
            f"{statistics.mean(row['tokens']):.1f} |"
        )
    by_service: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for service, name, size in rss:
        by_service[service].append((name, size))
    lines += [
        "",
        "Resident memory at rest after the calls (RSS; shared library pages count in each "
        "process):",
        "",
        "| service | processes (RSS MB) | total MB |",
        "|---|---|---|",
    ]
    for service, processes in by_service.items():
        parts = ", ".join(f"{name} {size / 1e6:.0f}" for name, size in processes)
        lines.append(f"| {service} | {parts} | {sum(s for _, s in processes) / 1e6:.0f} |")
    lines.append(f"| all | | {sum(s for *_, s in rss) / 1e6:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--start", type=Path, default=REPO / "runs" / "bench_vs_trl" / "start")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    start = build_start(args.start.resolve())
    began = datetime.now(UTC)
    load_before = uptime()
    env = {
        "LOOM_ROLLOUT_KV_CACHE_GIB": str(64 / 1024),
        "HF_HUB_OFFLINE": "1",
        "LOOM_ROLLOUT_MODEL": str(start),
    }
    with (
        tempfile.TemporaryDirectory(prefix="sample-batch-") as work,
        local_stack(Path(work), env=env) as stack,
    ):
        seen = asyncio.run(measure(stack, start, args.rounds, args.calls))
        rss = memory(stack)
    text = report(seen, rss, args, (load_before, uptime()), began)
    print(text)
    if not args.out.exists():
        args.out.write_text(
            "# Sampling a GRPO step: a request per prompt or one batch\n\n"
            + (__doc__ or "").split("\n\n    .venv")[0]
            + "\n\n"
        )
    with args.out.open("a") as fh:
        fh.write(text + "\n")


def uptime() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
