"""Hand-off latency: from `save_weights()` returning to the first sample served by the new
version, for full weights and a LoRA adapter, through the gateway on the real local stack.

Baseline, measured in the same run: the same one-token sample request on a version that is
already loaded (what a sample costs when no hand-off is involved). The ratio is hand-off /
baseline. Writes bench/results/handoff.md.

    .venv/bin/python bench/handoff.py [--repeats 10]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from agents.algorithms import sft_datum
from agents.sdk import AdamParams, LoomClient, SamplingParams
from gateway.cli.supervisor import Supervisor
from services.common.ports import free_port
from services.common.settings import SERVICES, LoomSettings

RESULTS = Path(__file__).resolve().parent / "results" / "handoff.md"
ONE_TOKEN = SamplingParams(max_tokens=1, temperature=0.0)


def measure(loom: LoomClient, mode: str, repeats: int) -> dict[str, list[float]]:
    job = loom.create_job("loom/tiny", name=f"bench-{mode}", mode=mode)
    prompt, answer = loom.tokenize(["12+7=", "19<|endoftext|>"])
    handoff, baseline = [], []
    for _ in range(repeats):
        job.forward_backward([sft_datum(prompt, answer)])
        job.optim_step(AdamParams(lr=1e-3))
        number = job.save_weights().result().number
        start = time.perf_counter()
        served = job.sample(prompt, params=ONE_TOKEN, version="latest")
        handoff.append(time.perf_counter() - start)
        assert served.version == number, (served.version, number)
        start = time.perf_counter()
        job.sample(prompt, params=ONE_TOKEN, version=number)
        baseline.append(time.perf_counter() - start)
    return {"handoff": handoff, "baseline": baseline}


def ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        urls = {f"{name}_url": f"http://127.0.0.1:{free_port()}" for name in SERVICES}
        settings = LoomSettings(data_dir=Path(data_dir), **urls)
        with Supervisor(settings) as supervisor:
            supervisor.start()
            key = (Path(data_dir) / "admin_key").read_text().strip()
            with LoomClient(settings.gateway_url, key) as loom:
                results = {mode: measure(loom, mode, args.repeats) for mode in ("full", "lora")}
    lines = [
        f"# Hand-off: save_weights() returned → first sample on the new version ({args.repeats} "
        f"repeats, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
        "",
        "Embedded stack on this machine (2 CPU cores, tiny model, all services local), through "
        "the gateway. Baseline: the same 1-token sample on an already-loaded version.",
        "",
        "| mode | hand-off p50 ms | hand-off p90 ms | baseline p50 ms | ratio p50 |",
        "|---|---|---|---|---|",
    ]
    for mode, r in results.items():
        ratio = statistics.median(r["handoff"]) / statistics.median(r["baseline"])
        lines.append(f"| {mode} | {ms(r['handoff'], 0.5):.1f} | {ms(r['handoff'], 0.9):.1f} | "
                     f"{ms(r['baseline'], 0.5):.1f} | {ratio:.2f} |")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
