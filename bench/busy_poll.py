"""How long vLLM's engine processes busy-poll their queues after a message
(`LOOM_ROLLOUT_CPU_BUSY_POLL_MS`), against what it costs and saves on a CPU machine.

While a queue reader spins (sched_yield), it holds a core from every other process; while it
sleeps, the next message must wake it. The engine core waits on its worker's reply for the
whole of a weight reload, so during a hand-off it spins while the store hashes and commits
the version and the trainer and SDK hear of it; between decode steps, a reader that sleeps
pays a wake-up per step. Each value runs on a fresh local stack (the 1 MB random-init model),
values taking turns round by round (the VM's speed drifts over minutes), and measures:

- hand-off: `save_weights()` returned → first 1-token sample on the new version (bench/handoff.py's
  measure), p50 over the round's repeats;
- loaded sample: the same 1-token sample once loaded;
- one stream: one 64-token sample (a wake-up per decode step if the reader sleeps);
- batch: 32 samples of 64 tokens in one request, generated tokens per second.

Ratios are against the first value (the baseline), over the medians of all rounds. Writes
bench/results/busy_poll.md.

    .venv/bin/python -m bench.busy_poll [--values 20 2] [--rounds 2] [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

from agents.sdk import JobClient, SamplingParams
from bench.handoff import REPO, Row, ensure_model, measure_job, stack

RESULTS = REPO / "bench" / "results" / "busy_poll.md"
STREAM = SamplingParams(max_tokens=64, temperature=1.0)
BATCH_N = 32
METRICS = ("hand-off ms", "loaded sample ms", "one stream ms", "batch tok/s")
DESCRIPTION = (
    "Each value ran on a fresh local stack (every service a process; the 1 MB random-init "
    "Qwen2-style model, float32), the values taking turns round by round. *hand-off*: "
    "`save_weights()` returned → first 1-token greedy sample on the new version (as in "
    "bench/handoff.py); *loaded sample*: the same sample once loaded; *one stream*: one "
    "64-token sample; *batch*: 32 samples of 64 tokens in one request, generated tokens per "
    "second; *slowest*: the slowest hand-off or stream of all rounds (a reader that missed "
    "its wake-up stalls for seconds). Cells: the median over rounds of each round's median; "
    "×: over the first value's (below 1 is faster for times, slower for tok/s)."
)


def sampling(job: JobClient, repeats: int) -> dict[str, float]:
    """Medians of one 64-token stream and batch throughput on the job's loaded version."""
    prompt = "12+7="
    streams, rates = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        job.sample(prompt, params=STREAM)
        streams.append(time.perf_counter() - started)
    for _ in range(max(3, repeats // 3)):
        started = time.perf_counter()
        response = job.sample(prompt, n=BATCH_N, params=STREAM)
        tokens = sum(len(s.token_ids) for s in response.samples)
        rates.append(tokens / (time.perf_counter() - started))
    return {
        "one stream ms": 1000 * statistics.median(streams),
        "batch tok/s": statistics.median(rates),
        "slowest stream ms": 1000 * max(streams),
    }


def run_value(value: float, model_dir: Path, work: Path, repeats: int) -> dict[str, float]:
    env = {"LOOM_ROLLOUT_CPU_BUSY_POLL_MS": str(value)}
    with stack(model_dir, work, env) as (loom, trainer_pid):
        row = Row(name=f"busy poll {value:g} ms", mode="full")
        measured = sampling(measure_job(loom, trainer_pid, row, model_dir, repeats), repeats)
    return {
        "hand-off ms": 1000 * statistics.median(row.handoff),
        "slowest hand-off ms": 1000 * max(row.handoff),
        "loaded sample ms": 1000 * statistics.median(row.steady_sample),
        **measured,
    }


def report(
    values: list[float], results: dict[float, list[dict[str, float]]], args: argparse.Namespace
) -> str:
    base = values[0]
    medians = {v: {m: statistics.median(r[m] for r in results[v]) for m in METRICS} for v in values}
    header = (
        "| busy poll ms | "
        + " | ".join(f"{m} | × {base:g} ms" for m in METRICS)
        + " | hand-off ms per round | slowest ms |"
    )
    lines = [
        f"# Engine queue busy-polling on CPU (run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
        "",
        f"`.venv/bin/python -m bench.busy_poll --values {' '.join(f'{v:g}' for v in values)} "
        f"--rounds {args.rounds} --repeats {args.repeats}` on {platform.node()} "
        f"({os.cpu_count()} cores, no GPU). {DESCRIPTION}",
        "",
        header,
        "|" + "---|" * (3 + 2 * len(METRICS)),
    ]
    for v in values:
        cells = []
        for m in METRICS:
            cells += [f"{medians[v][m]:.1f}", f"{medians[v][m] / medians[base][m]:.2f}"]
        rounds = ", ".join(f"{r['hand-off ms']:.1f}" for r in results[v])
        slowest = max(max(r["slowest hand-off ms"], r["slowest stream ms"]) for r in results[v])
        lines.append(f"| {v:g} | " + " | ".join(cells) + f" | {rounds} | {slowest:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--values", type=float, nargs="+", default=[20.0, 2.0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--models-dir", type=Path, default=REPO / ".loom-test-cache" / "bench-models"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    model_dir = ensure_model(args.models_dir, "1mb")
    results: dict[float, list[dict[str, float]]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="loom-bench-") as temp:
        for round_index in range(args.rounds):
            order = args.values if round_index % 2 == 0 else args.values[::-1]
            for value in order:
                results[value].append(run_value(value, model_dir, Path(temp), args.repeats))
                print(
                    f"round {round_index + 1}, {value:g} ms: {results[value][-1]}",
                    file=sys.stderr,
                    flush=True,
                )
    text = report(args.values, results, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
