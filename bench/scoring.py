"""Scoring cost: the reward service as it was (a checkout of `--base`, the commit before issue
38's scoring work) against this tree's, both real services (`python -m services.reward`) over
HTTP, rounds interleaved in one run.

A step is 16 groups of 8 short arithmetic answers (what the demo's GRPO step and the Pipeline
score). For `regex`, `exact_match` and `first_integer` (this tree only) it measures:
- one 8-item request alone: the service's own time (its `loom_http_request_seconds` histogram,
  to the response's start) and the client's;
- a step's scoring wall time: 16 `POST /v1/score` at once (what the rollout service sent, a
  request per group), one `POST /v1/score/batch` of 16 batches, and the rollout service's
  `RewardScorer`, which gathers 16 groups asking at once into one batch request (its 2 ms
  gathering wait included). Server time per request comes from the histogram too.

With `--rollout-steps N` (N > 0) it also runs N rollout requests of the `arithmetic`
environment (16 tasks x 8, 8 new tokens, temperature 1) through a real rollout service (vLLM,
the tiny model) scoring on this tree's reward service, and counts the scoring requests each
made (before: one per group, by construction).

Writes bench/results/scoring.md.

    .venv/bin/python -m bench.scoring [--rounds 5] [--steps 20] [--base 5a1936a]
        [--rollout-steps 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

from bench._stack import until_ready
from services.common.http import ServiceClient
from services.common.ports import free_port
from services.common.service_token import service_headers
from services.common.settings import LoomSettings
from services.reward.schemas import ScoreItem
from services.rollout.peers import RewardScorer

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "scoring.md"
GROUPS, GROUP_SIZE = 16, 8
VERIFIERS: dict[str, dict[str, Any]] = {
    "regex": {"pattern": r"^\s*-?\d+\s*$"},
    "exact_match": {},
    "first_integer": {},
}


def group(index: int) -> list[dict[str, str]]:
    """A group's answers to `a+b=`: some right, some wrong, some with trailing text."""
    answer = 20 + index
    replies = [
        f"{answer}",
        f"{answer + 1}",
        f" {answer}",
        f"{answer}3",
        f"{answer} 7",
        f"{answer - 10}",
        "",
        f"{answer}",
    ]
    return [{"response": r, "reference": str(answer)} for r in replies[:GROUP_SIZE]]


@dataclass
class Service:
    name: str
    client: httpx2.AsyncClient
    url: str
    headers: dict[str, str]

    async def server_seconds(self, route: str) -> tuple[float, float]:
        """(sum, count) of the service's request-latency histogram for `route`."""
        total = count = 0.0
        for line in (await self.client.get("/metrics")).text.splitlines():
            if f'route="{route}"' not in line:
                continue
            if line.startswith("loom_http_request_seconds_sum"):
                total = float(line.rsplit(" ", 1)[1])
            elif line.startswith("loom_http_request_seconds_count"):
                count = float(line.rsplit(" ", 1)[1])
        return total, count


@contextlib.asynccontextmanager
async def service(
    name: str, checkout: Path, module: str, data_dir: Path, env: dict[str, str] | None = None
) -> AsyncIterator[Service]:
    """`python -m services.<module>` from `checkout` (its `services` package comes first on
    the path), on a free port, once ready."""
    port = free_port()
    settings = LoomSettings(data_dir=data_dir)
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", f"services.{module}"],
        cwd=checkout,
        env={
            **os.environ,
            **(env or {}),
            f"LOOM_{module.upper()}_URL": url,
            "LOOM_DATA_DIR": str(data_dir),
            "LOOM_LOG_LEVEL": "warning",
        },
    )
    limits = httpx2.Limits(max_connections=64, max_keepalive_connections=64)
    try:
        async with httpx2.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
            await until_ready(client, process, f"{name} {module} service", 900)
            headers = service_headers(settings)
            client.headers.update(headers)
            yield Service(name, client, url, headers)
    finally:
        process.terminate()
        process.wait(timeout=60)


@contextlib.asynccontextmanager
async def reward_service(name: str, checkout: Path) -> AsyncIterator[Service]:
    with tempfile.TemporaryDirectory(prefix=f"bench-scoring-{name}-") as data_dir:
        async with service(name, checkout, "reward", Path(data_dir)) as started:
            yield started


@dataclass
class Samples:
    walls: list[float] = field(default_factory=list)
    server_s: float = 0.0
    requests: float = 0.0

    def add(self, other: Samples) -> None:
        self.walls += other.walls
        self.server_s += other.server_s
        self.requests += other.requests


Step = Callable[[str, dict[str, Any]], Awaitable[None]]


async def timed(service: Service, route: str, step: Step, verifier: str, steps: int) -> Samples:
    params = VERIFIERS[verifier]
    await step(verifier, params)  # warm: connections, caches
    before = await service.server_seconds(route)
    walls = []
    for _ in range(steps):
        started = time.perf_counter()
        await step(verifier, params)
        walls.append(time.perf_counter() - started)
    after = await service.server_seconds(route)
    return Samples(walls, after[0] - before[0], after[1] - before[1])


def arms(service: Service, scorer: RewardScorer | None) -> dict[str, tuple[str, Step]]:
    client = service.client

    async def post(path: str, body: dict[str, Any]) -> None:
        response = await client.post(path, json=body)
        assert response.status_code == 200, response.text

    async def one_request(verifier: str, params: dict[str, Any]) -> None:
        await post("/v1/score", {"verifier": verifier, "params": params, "items": group(0)})

    async def per_group(verifier: str, params: dict[str, Any]) -> None:
        await asyncio.gather(
            *(
                post("/v1/score", {"verifier": verifier, "params": params, "items": group(g)})
                for g in range(GROUPS)
            )
        )

    async def batch(verifier: str, params: dict[str, Any]) -> None:
        await post(
            "/v1/score/batch",
            {
                "batches": [
                    {"verifier": verifier, "params": params, "items": group(g)}
                    for g in range(GROUPS)
                ]
            },
        )

    async def gathered(verifier: str, params: dict[str, Any]) -> None:
        assert scorer is not None
        await asyncio.gather(
            *(
                scorer.score(verifier, [ScoreItem(**i) for i in group(g)], params)
                for g in range(GROUPS)
            )
        )

    found = {
        "one 8-item request": ("/v1/score", one_request),
        "step: 16 requests at once": ("/v1/score", per_group),
    }
    if scorer is not None:
        found |= {
            "step: one batch request": ("/v1/score/batch", batch),
            "step: rollout's RewardScorer": ("/v1/score/batch", gathered),
        }
    return found


async def run(base: Path, rounds: int, steps: int) -> dict[tuple[str, str, str], Samples]:
    results: dict[tuple[str, str, str], Samples] = {}
    async with reward_service("before", base) as before, reward_service("after", REPO) as after:
        scorer = RewardScorer(ServiceClient(after.url, service="reward", headers=after.headers))
        for round_ in range(rounds):
            for service, gatherer in ((before, None), (after, scorer)):
                for arm, (route, step) in arms(service, gatherer).items():
                    for verifier in VERIFIERS:
                        if verifier == "first_integer" and service is before:
                            continue  # not a verifier before
                        samples = await timed(service, route, step, verifier, steps)
                        results.setdefault((service.name, arm, verifier), Samples()).add(samples)
            print(f"round {round_ + 1}/{rounds} done", flush=True)
        await scorer.client.http.aclose()
    return results


@dataclass
class RolloutCounts:
    requests: list[float] = field(default_factory=list)  # scoring requests per rollout request
    walls: list[float] = field(default_factory=list)
    unscored: int = 0


async def rollout_requests(steps: int) -> RolloutCounts:
    """Scoring requests per rollout request of a step's 16 groups (see the module doc)."""
    from services.common.base_models import ensure_tiny_model

    model = ensure_tiny_model(REPO / ".loom-test-cache" / "models" / "tiny")
    counts = RolloutCounts()
    with tempfile.TemporaryDirectory(prefix="bench-scoring-rollout-") as temp:
        data_dir = Path(temp)
        async with (
            service("after", REPO, "reward", data_dir) as reward,
            service(
                "after",
                REPO,
                "rollout",
                data_dir,
                {"LOOM_REWARD_URL": reward.url, "LOOM_ROLLOUT_MODEL": str(model)},
            ) as rollout,
        ):
            tasks = [{"prompt": f"{a}+{a + 7}=", "reference": str(2 * a + 7)} for a in range(16)]
            body = {
                "env": "arithmetic",
                "tasks": tasks,
                "group_size": GROUP_SIZE,
                "params": {"max_tokens": 8, "temperature": 1.0},
            }
            for step in range(steps + 1):  # the first warms the engine up
                before = (await reward.server_seconds("/v1/score/batch"))[1]
                started = time.perf_counter()
                response = await rollout.client.post("/v1/rollouts", json=body)
                wall = time.perf_counter() - started
                assert response.status_code == 200, response.text
                made = (await reward.server_seconds("/v1/score/batch"))[1] - before
                if step:
                    counts.requests.append(made)
                    counts.walls.append(wall)
                    counts.unscored += response.text.count('"reward_error"')
    return counts


def report(
    results: dict[tuple[str, str, str], Samples],
    args: argparse.Namespace,
    load: tuple[tuple[float, ...], tuple[float, ...]],
    rollouts: RolloutCounts | None,
) -> str:
    lines = [
        "# Scoring cost: reward service before and after (issue 38)",
        "",
        f"`python -m bench.scoring --rounds {args.rounds} --steps {args.steps} "
        f"--base {args.base} --rollout-steps {args.rollout_steps}`: both services run at once "
        "as processes (`python -m services.reward`, default settings: 2 workers), the `before` "
        "one from a checkout of "
        f"`{args.base}`, rounds interleaved. A step is {GROUPS} groups of {GROUP_SIZE} short "
        "arithmetic answers. Server time: the service's own latency histogram (request in to "
        "response start), per request. Client wall: medians.",
        "",
        f"Machine: {os.cpu_count()} cores shared with other work; load average (1, 5, 15 min) "
        f"{', '.join(f'{x:.2f}' for x in load[0])} at the start and "
        f"{', '.join(f'{x:.2f}' for x in load[1])} at the end, so every number is an upper "
        "bound.",
        "",
        "| service | what | verifier | requests per step | server ms per request | "
        "client wall ms (median) | p90 |",
        "|---|---|---|---|---|---|---|",
    ]
    for (service, arm, verifier), samples in results.items():
        per_step = samples.requests / len(samples.walls)
        server_ms = 1000 * samples.server_s / samples.requests
        walls = sorted(samples.walls)
        p90 = walls[int(0.9 * (len(walls) - 1))]
        lines.append(
            f"| {service} | {arm} | {verifier} | {per_step:g} | {server_ms:.2f} | "
            f"{1000 * statistics.median(walls):.2f} | {1000 * p90:.2f} |"
        )
    lines += [
        "",
        "Before: `regex` ran each item in a worker process (one process hop per item, at most "
        "2 at once across all requests); `exact_match` inline, a request per group. After: "
        "`regex` runs a batch at a time on the `regex` engine with a deadline per item, in a "
        "thread of the service's (no process hop); `first_integer` and `exact_match` inline; "
        "a step's groups go in one `POST /v1/score/batch`. The RewardScorer row is the "
        "rollout service's path: it waits 2 ms for the groups that finish together.",
        "",
    ]
    if rollouts is not None:
        lines += [
            "## Scoring requests per rollout request (real rollout service)",
            "",
            f"{len(rollouts.requests)} rollout requests of 16 `arithmetic` tasks x "
            f"{GROUP_SIZE} (8 new tokens, temperature 1, the tiny model on vLLM CPU) after one "
            "warm-up: scoring requests each made to the reward service (its own count): "
            f"{', '.join(f'{r:g}' for r in rollouts.requests)} (before: 16, one per group). "
            f"Rollout request wall, median: {1000 * statistics.median(rollouts.walls):.0f} ms; "
            f"trajectories left unscored: {rollouts.unscored}.",
            "",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--base", default="5a1936a", help="the commit to measure as before")
    parser.add_argument("--rollout-steps", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-scoring-base-") as checkout:
        # The base's services package only (all the reward service imports), read from git
        # without touching the work tree or the repository's state.
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", args.base, "services"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", checkout], input=archive, check=True)
        load_start = os.getloadavg()
        results = asyncio.run(run(Path(checkout), args.rounds, args.steps))
        load = (load_start, os.getloadavg())
    rollouts = asyncio.run(rollout_requests(args.rollout_steps)) if args.rollout_steps else None
    RESULTS.write_text(report(results, args, load, rollouts))
    print(RESULTS.read_text())


if __name__ == "__main__":
    main()
