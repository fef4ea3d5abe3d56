"""What vLLM's LoRA layers cost a full-weights job: generation tokens/s of a bare rollout engine
built with the rollout service's arguments (`services.rollout.engine.engine_args`), with LoRA
support (`LOOM_ROLLOUT_MAX_LORAS=4`, the default) and without it (`0`), no adapter active in
either, on the same prompts and sampling options. Writes bench/results/lora_layers.md.

Each round starts one engine per arm in turn (the order reversed every other round: the
machine's speed drifts over minutes), warms it up, then samples `--batches` batches at each
concurrency: that many requests at once, each `--max-tokens` tokens (no early stop), with the
service's own vLLM sampling options (the sampled token's logprob, final output only). Placement
as in bench/rollout_overhead.py: the engine's processes (EngineCore, worker, one OMP thread) on
core 0, this process (the AsyncLLM frontend) on the others.

    .venv/bin/python -m bench.lora_layers [--rounds 3] [--concurrency 32 64 128]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import statistics
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

from bench.rollout_overhead import engine_env
from services.common.base_models import ensure_tiny_model
from services.rollout.engine import engine_args
from services.rollout.sampling import vllm_params
from services.rollout.schemas import SamplingParams
from services.rollout.settings import RolloutSettings

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "lora_layers.md"
MODEL_DIR = REPO / ".loom-test-cache" / "bench-models" / "tiny"
ARMS = {"LoRA layers (max_loras 4)": 4, "no LoRA layers (max_loras 0)": 0}
PROMPT_TOKENS = 12

Rates = dict[tuple[str, int], list[float]]  # (arm, concurrency) → tokens/s of each batch


async def measure_arm(
    max_loras: int, concurrency: list[int], batches: int, max_tokens: int
) -> dict[int, list[float]]:
    from vllm.v1.engine.async_llm import AsyncLLM

    settings = RolloutSettings(rollout_max_loras=max_loras)
    os.environ.update(engine_env(settings))
    frontend = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})  # the engine's processes inherit core 0
    try:
        llm = AsyncLLM.from_engine_args(engine_args(settings, str(MODEL_DIR)))
    finally:
        os.sched_setaffinity(0, frontend)
    params = vllm_params(SamplingParams(max_tokens=max_tokens, temperature=1.0), detokenize=False)
    params.ignore_eos = True  # every request samples max_tokens: equal work in both arms
    prompt = {"prompt_token_ids": list(range(100, 100 + PROMPT_TOKENS))}

    async def one() -> int:
        final = None
        async for output in llm.generate(prompt, params, uuid.uuid4().hex):
            final = output
        assert final is not None
        return len(final.outputs[0].token_ids)

    async def batch(size: int) -> float:
        began = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one() for _ in range(size))))
        return tokens / (time.perf_counter() - began)

    try:
        await batch(max(concurrency))  # warm-up: the first steps of each batch shape
        return {size: [await batch(size) for _ in range(batches)] for size in concurrency}
    finally:
        llm.shutdown()


def report(rates: Rates, args: argparse.Namespace) -> str:
    with_lora, without = ARMS
    lines = [
        "# vLLM's LoRA layers: what they cost a full-weights job",
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} "
        f"({os.cpu_count()} cores, {platform.machine()}, no GPU); `.venv/bin/python -m "
        f"bench.lora_layers --rounds {args.rounds} --concurrency "
        f"{' '.join(map(str, args.concurrency))} --batches {args.batches} --max-tokens "
        f"{args.max_tokens}`.",
        "",
        "A bare rollout engine (the service's `engine_args`: tiny model, float32, eager) on core "
        "0, the frontend on the other cores; no adapter is active in either arm. Tokens/s = "
        f"completion tokens / wall time of a batch of `concurrency` requests of {PROMPT_TOKENS} "
        f"prompt tokens and {args.max_tokens} sampled tokens each (no early stop); the median "
        f"over {args.rounds} round(s) × {args.batches} batch(es), one engine start per arm per "
        "round.",
        "",
        f"| concurrency | {with_lora} tok/s | {without} tok/s | without / with | per batch, "
        "without / with |",
        "|---|---|---|---|---|",
    ]
    for size in args.concurrency:
        on, off = rates[(with_lora, size)], rates[(without, size)]
        paired = sorted(b / a for a, b in zip(on, off, strict=True))
        lines.append(
            f"| {size} | {statistics.median(on):.0f} | {statistics.median(off):.0f} | "
            f"**{statistics.median(off) / statistics.median(on):.2f}×** | "
            f"{paired[0]:.2f} to {paired[-1]:.2f} |"
        )
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> Rates:
    ensure_tiny_model(MODEL_DIR)
    rates: Rates = defaultdict(list)
    for round_ in range(1, args.rounds + 1):
        order = list(ARMS) if round_ % 2 else list(ARMS)[::-1]
        for arm in order:
            measured = await measure_arm(ARMS[arm], args.concurrency, args.batches, args.max_tokens)
            gc.collect()  # the engine's last references: it shuts down now, not at exit
            for size, values in measured.items():
                rates[(arm, size)].extend(values)
                print(
                    f"round {round_}, {arm}, concurrency {size}: "
                    f"{', '.join(f'{v:.0f}' for v in values)} tok/s",
                    flush=True,
                )
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--batches", type=int, default=2, help="per concurrency, arm and round")
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, set(range(1, os.cpu_count() or 1)))
    rates = asyncio.run(main_async(args))
    text = report(rates, args)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
