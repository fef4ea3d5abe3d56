"""One trainer call per SDK pass: a Tinker or Weaver `forward_backward` needs the loss's
gradients and the per-token logprobs. The gateway used to ask the trainer for both as two
operations (`forward`, then `forward_backward`); now it asks one `forward_backward` with
`return_logprobs`. Both arms run here, interleaved, against one real trainer process (tiny
model, LoRA rank 8, CPU) on the same data. Writes bench/results/trainer_pass.md.

    .venv/bin/python -m bench.trainer_pass [--batch 8] [--tokens 128] [--rounds 12]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2

from services.common.base_models import ensure_tiny_model
from services.common.ports import free_port
from services.common.service_token import service_headers
from services.common.settings import LoomSettings

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "trainer_pass.md"
JOB = "bench-pass"
LOSS = {"name": "importance_sampling", "aggregation": "sum"}


def start_trainer(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    url = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, "LOOM_DATA_DIR": str(data_dir), "LOOM_TRAINER_URL": url}
    process = subprocess.Popen(
        [sys.executable, "-m", "services.trainer"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx2.get(f"{url}/readyz", timeout=2).status_code == 200:
                return process, url
        except httpx2.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError("the trainer did not become ready")


def run(http: httpx2.Client, action: str, body: dict[str, Any]) -> dict[str, Any]:
    response = http.post(f"/v1/models/{JOB}/{action}", json=body)
    if response.status_code >= 400:
        raise RuntimeError(f"{action}: {response.status_code} {response.text}")
    op = response.json()
    while True:
        op = http.get(f"/v1/operations/{op['id']}", params={"wait": 30}).json()
        if op["status"] == "succeeded":
            return op["result"]  # type: ignore[no-any-return]
        if op["status"] == "failed":
            raise RuntimeError(op["error"])


def batch(size: int, tokens: int, vocab: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {
            "input_ids": [rng.randrange(vocab) for _ in range(tokens)],
            "loss_mask": [0.0] + [1.0] * (tokens - 1),
            "advantages": [rng.uniform(-1, 1)] * tokens,
            "logprobs": [-6.0] * tokens,
        }
        for _ in range(size)
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="loom-bench-pass-"))
    model = ensure_tiny_model(work / "models" / "tiny")
    process, url = start_trainer(work)
    timings: dict[str, list[float]] = {"two calls": [], "one call": []}
    try:
        headers = service_headers(LoomSettings(data_dir=work))  # the trainer's data dir
        with httpx2.Client(base_url=url, timeout=120, headers=headers) as http:
            created = (
                http.post(
                    "/v1/models",
                    json={
                        "job_id": JOB,
                        "base_model": str(model),
                        "mode": "lora",
                        "lora": {"rank": 8, "alpha": 8.0},
                    },
                )
                .raise_for_status()
                .json()
            )
            vocab = json.loads((model / "config.json").read_text())["vocab_size"]
            data = batch(args.batch, args.tokens, vocab, seed=0)
            arms = {
                "two calls": lambda: (
                    run(http, "forward", {"data": data}),
                    run(http, "forward_backward", {"data": data, "loss": LOSS}),
                ),
                "one call": lambda: run(
                    http, "forward_backward", {"data": data, "loss": LOSS, "return_logprobs": True}
                ),
            }
            for arm in arms.values():  # warm-up: first-call allocations in each arm
                arm()
            for round_ in range(args.rounds):
                order = list(arms) if round_ % 2 == 0 else list(reversed(arms))
                for name in order:
                    started = time.perf_counter()
                    arms[name]()
                    timings[name].append(time.perf_counter() - started)
    finally:
        process.terminate()
        process.wait(timeout=30)
    write(args, created, timings)


def write(args: argparse.Namespace, model: dict[str, Any], timings: dict[str, list[float]]) -> None:
    two, one = (statistics.median(timings[arm]) for arm in ("two calls", "one call"))
    lines = [
        "# One trainer call per SDK forward_backward",
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} "
        f"({os.cpu_count()} CPUs), `python -m bench.trainer_pass --batch {args.batch} "
        f"--tokens {args.tokens} --rounds {args.rounds}`: the tiny model "
        f"({model['num_params']:,} parameters), LoRA rank 8 "
        f"({model['trainable_params']:,} trainable), one trainer process on CPU, "
        f"importance_sampling on {args.batch} sequences of {args.tokens} tokens. Each arm is "
        "one SDK forward_backward as the gateway serves it (submit and wait, logprobs and "
        "gradients both), interleaved round by round.",
        "",
        "| arm | median s | min s | max s |",
        "|---|---|---|---|",
    ]
    for arm, values in timings.items():
        lines.append(
            f"| {arm} | {statistics.median(values):.3f} | {min(values):.3f} | {max(values):.3f} |"
        )
    lines += ["", f"Speed-up of one call over two (median ratio): **{two / one:.2f}x**", ""]
    RESULTS.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
