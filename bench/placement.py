"""Where the cores of a small machine should go in the embedded default's synchronous loop:
the trainer's torch threads (LOOM_TRAINER_THREADS) and the engine's OpenMP threads
(VLLM_CPU_OMP_THREADS_BIND), each measured while the other side is idle, as a sync loop leaves
it, and the trainer also while an engine samples without pause (the async Pipeline's case).

Arms run side by side as separate processes, interleaved round by round: three trainers (1
torch thread; one per core; one per core with OpenMP's threads sleeping at once when they wait
instead of spinning first) and two rollout services (vLLM's automatic binding, which keeps a
core for its front end and gives the model one thread per remaining core, and one thread per
core with none kept). Work: the GRPO step of issue 38 on the tiny model: forward_backward of
16 prompts x 8 samples (rows of 20 tokens, full weights); sampling of 16 prompts x 8 samples
x 8 new tokens, the 16 requests at once. Adds a section to bench/results/placement.md.

    .venv/bin/python -m bench.placement [--rounds 10] [--trainer-only]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2

from bench.trainer_pass import run
from services.common.base_models import ensure_tiny_model
from services.common.ports import free_port
from services.common.service_token import service_headers
from services.common.settings import LoomSettings

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "placement.md"
JOB = "bench-pass"  # the job `bench.trainer_pass.run` drives
LOSS = {"name": "importance_sampling", "aggregation": "sum"}
PROMPTS, SAMPLES, PROMPT_TOKENS, NEW_TOKENS = 16, 8, 12, 8
CORES = os.cpu_count() or 1


@contextmanager
def service(
    module: str, name: str, work: Path, env: Mapping[str, str], timeout_s: float = 600
) -> Iterator[httpx2.Client]:
    """`python -m <module>` with its own data dir, until ready; a client with its token."""
    data_dir = work / name
    data_dir.mkdir()
    url = f"http://127.0.0.1:{free_port()}"
    key = "LOOM_TRAINER_URL" if module == "services.trainer" else "LOOM_ROLLOUT_URL"
    process = subprocess.Popen(
        [sys.executable, "-m", module],
        env={**os.environ, "LOOM_DATA_DIR": str(data_dir), key: url, **env},
        stdout=subprocess.DEVNULL,
        stderr=open(data_dir / "log", "wb"),  # noqa: SIM115
        start_new_session=True,
    )
    try:
        headers = service_headers(LoomSettings(data_dir=data_dir))
        with httpx2.Client(base_url=url, timeout=300, headers=headers) as http:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    if http.get("/readyz", timeout=5).status_code == 200:
                        break
                except httpx2.HTTPError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not start: see {data_dir / 'log'}")
                time.sleep(0.5)
            yield http
    finally:
        os.killpg(process.pid, 15)
        process.wait(timeout=60)


def grpo_batch(vocab: int) -> list[dict[str, Any]]:
    rng = random.Random(0)
    tokens = PROMPT_TOKENS + NEW_TOKENS
    return [
        {
            "input_ids": [rng.randrange(vocab) for _ in range(tokens)],
            "loss_mask": [0.0] * PROMPT_TOKENS + [1.0] * NEW_TOKENS,
            "advantages": [rng.uniform(-1, 1)] * tokens,
            "logprobs": [-6.0] * tokens,
        }
        for _ in range(PROMPTS * SAMPLES)
    ]


def sample_batch(http: httpx2.Client, seed: int) -> None:
    """The 16 requests of a step at once, as the SDK sends them."""

    async def all_at_once() -> None:
        async with httpx2.AsyncClient(
            base_url=str(http.base_url), headers=http.headers, timeout=300
        ) as client:
            responses = await asyncio.gather(
                *(
                    client.post(
                        "/v1/sample",
                        json={
                            "prompt_token_ids": [
                                (7 * p + i) % 50 + 3 for i in range(PROMPT_TOKENS)
                            ],
                            "n": SAMPLES,
                            "params": {
                                "max_tokens": NEW_TOKENS,
                                "seed": seed + p,
                                "temperature": 1.0,
                            },
                        },
                    )
                    for p in range(PROMPTS)
                )
            )
            for response in responses:
                response.raise_for_status()

    asyncio.run(all_at_once())


def timed(arms: Mapping[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    for arm in arms.values():  # warm-up
        arm()
    times: dict[str, list[float]] = {name: [] for name in arms}
    for round_ in range(rounds):
        for name in list(arms)[:: 1 if round_ % 2 == 0 else -1]:
            started = time.perf_counter()
            arms[name]()
            times[name].append(time.perf_counter() - started)
    return times


@contextmanager
def sampling_without_pause(http: httpx2.Client) -> Iterator[None]:
    stop = threading.Event()

    def loop() -> None:
        seed = 0
        while not stop.is_set():
            sample_batch(http, seed)
            seed += 1

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        time.sleep(2)  # the engine busy before the first timed call
        yield
    finally:
        stop.set()
        thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--trainer-only",
        action="store_true",
        help="only the trainers, with no engine running (a minute, for the "
        "moments the machine is quiet)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loom-bench-placement-") as temp:
        rows, load = measure(args, Path(temp))
    write(args, rows, load)


def measure(args: argparse.Namespace, work: Path) -> tuple[dict[str, list[float]], list[float]]:
    model = ensure_tiny_model(work / "models" / "tiny")
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    data = grpo_batch(vocab)
    engine_env = {"LOOM_ROLLOUT_MODEL": str(model), "LOOM_ROLLOUT_ANNOUNCE": "false"}
    all_cores = ",".join(map(str, range(CORES)))
    rows: dict[str, list[float]] = {}
    load = [os.getloadavg()[0]]
    many = {"LOOM_TRAINER_THREADS": str(CORES)}
    with (
        service("services.trainer", "trainer-1", work, {"LOOM_TRAINER_THREADS": "1"}) as one,
        service("services.trainer", "trainer-n", work, many) as spinning,
        service(
            "services.trainer", "trainer-n-passive", work, {**many, "OMP_WAIT_POLICY": "PASSIVE"}
        ) as passive,
    ):
        arms = {
            "1 torch thread": one,
            f"{CORES} torch threads": spinning,
            f"{CORES} torch threads, OMP_WAIT_POLICY=PASSIVE": passive,
        }
        for http in arms.values():
            http.post(
                "/v1/models", json={"job_id": JOB, "base_model": str(model), "mode": "full"}
            ).raise_for_status()
        step = {"data": data, "loss": LOSS}
        trainers = {
            f"forward_backward, {name}": (lambda h=h: run(h, "forward_backward", step))
            for name, h in arms.items()
        }
        rows.update({f"{name}, engine idle": t for name, t in timed(trainers, args.rounds).items()})
        load.append(os.getloadavg()[0])
        if args.trainer_only:
            return rows, load
        with service("services.rollout", "rollout-auto", work, engine_env) as auto:
            with service(
                "services.rollout",
                "rollout-all",
                work,
                {
                    **engine_env,
                    "VLLM_CPU_OMP_THREADS_BIND": all_cores,
                    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
                },
            ) as every:
                engines = {
                    "sample 16x8x8, vLLM auto binding (1 core kept)": lambda: sample_batch(auto, 1),
                    f"sample 16x8x8, {CORES} OMP threads, none kept": lambda: sample_batch(
                        every, 1
                    ),
                }
                rows.update(
                    {f"{name}, trainer idle": t for name, t in timed(engines, args.rounds).items()}
                )
                load.append(os.getloadavg()[0])
            with sampling_without_pause(auto):
                rows.update(
                    {
                        f"{name}, engine sampling without pause (auto binding)": t
                        for name, t in timed(trainers, args.rounds).items()
                    }
                )
            load.append(os.getloadavg()[0])
    return rows, load


def write(args: argparse.Namespace, rows: dict[str, list[float]], load: list[float]) -> None:
    """Each run adds a section: a quiet moment and a busy one say different things."""
    head = (
        []
        if args.out.exists()
        else [
            f"# Placement on {CORES} cores: trainer threads and engine threads",
            "",
            (__doc__ or "").split("\n\n")[1].replace("\n", " "),
            "",
        ]
    )
    lines = [
        *head,
        f"## {'Trainers only' if args.trainer_only else 'All arms'}, "
        f"{args.rounds} interleaved rounds, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        "1-minute load average at start and after each part: "
        + ", ".join(f"{value:.1f}" for value in load)
        + " (a shared machine: times are upper bounds).",
        "",
        "| arm | p50 ms | p90 ms | min ms |",
        "|---|---|---|---|",
        *(
            f"| {name} | {1000 * statistics.median(t):.0f} | "
            f"{1000 * statistics.quantiles(t, n=10)[-1]:.0f} | {1000 * min(t):.0f} |"
            for name, t in rows.items()
        ),
    ]
    text = "\n".join(lines) + "\n"
    with open(args.out, "a") as out:
        out.write(text if head else "\n" + text)
    print(text)


if __name__ == "__main__":
    main()
