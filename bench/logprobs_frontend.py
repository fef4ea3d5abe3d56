"""vLLM's frontend CPU for sampled-token logprobs, flat (`FlatLogprobs`, what the rollout
service asks for) against nested (a dict and a `Logprob` per token, vLLM's default): the same
AsyncLLM (the rollout engine's arguments), the same batches, the arms alternating batch by
batch; then both again with the start-up heap frozen, as the rollout service freezes it. The
frontend is the process that runs the rollout service; what it spends competes with HTTP
handling and, on a small machine, with the engine. Writes bench/results/logprobs_frontend.md.

    .venv/bin/python -m bench.logprobs_frontend [--rounds 6] [--prompts 64] [--n 4]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from bench.rollout_overhead import direct_generate, engine_env
from services.common.base_models import ensure_tiny_model
from services.rollout.app import freeze_startup_heap
from services.rollout.engine import engine_args
from services.rollout.settings import RolloutSettings

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "logprobs_frontend.md"


@dataclass
class Arm:
    flat: bool
    cpu_s: list[float] = field(default_factory=list)  # per batch
    tokens: list[int] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    full_gc: int = 0  # generation-2 collections while its batches ran
    full_gc_s: float = 0.0

    @staticmethod
    def ms_per_1k(seconds: float, tokens: int) -> float:
        return 1e6 * seconds / tokens

    @property
    def per_batch_ms_per_1k(self) -> list[float]:
        return [self.ms_per_1k(c, t) for c, t in zip(self.cpu_s, self.tokens, strict=True)]

    @property
    def median_ms_per_1k(self) -> float:
        return statistics.median(self.per_batch_ms_per_1k)

    @property
    def median_tokens_per_s(self) -> float:
        return statistics.median(t / w for t, w in zip(self.tokens, self.wall_s, strict=True))

    @property
    def total_ms_per_1k(self) -> float:
        return self.ms_per_1k(sum(self.cpu_s), sum(self.tokens))

    @property
    def without_full_gc_ms_per_1k(self) -> float:
        return self.ms_per_1k(sum(self.cpu_s) - self.full_gc_s, sum(self.tokens))


class FullGcMeter:
    """CPU time of the garbage collector's full collections, charged to the running arm."""

    def __init__(self) -> None:
        self.arm: Arm | None = None
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2 or self.arm is None:
            return
        if phase == "start":
            self._began = time.process_time()
        else:
            self.arm.full_gc += 1
            self.arm.full_gc_s += time.process_time() - self._began


async def batch(
    llm: AsyncLLM, prompts: list[list[int]], args: argparse.Namespace, arm: Arm
) -> None:
    """Every prompt at once, each sample exactly `max_tokens` long."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = [
        SamplingParams(
            n=args.n,
            max_tokens=args.max_tokens,
            min_tokens=args.max_tokens,
            ignore_eos=True,
            temperature=1.0,
            seed=i,
            logprobs=0,
            detokenize=False,
            flat_logprobs=arm.flat,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        for i in range(len(prompts))
    ]
    cpu, wall = time.process_time(), time.perf_counter()
    outputs = await asyncio.gather(
        *(direct_generate(llm, p, q) for p, q in zip(prompts, params, strict=True))
    )
    arm.cpu_s.append(time.process_time() - cpu)
    arm.wall_s.append(time.perf_counter() - wall)
    arm.tokens.append(sum(len(c.token_ids) for o in outputs for c in o.outputs))


async def measure(model: Path, args: argparse.Namespace) -> dict[str, Arm]:
    """The arms with the heap as start-up left it, then the same after the rollout service's
    `freeze_startup_heap`."""
    from vllm.v1.engine.async_llm import AsyncLLM

    llm = AsyncLLM.from_engine_args(engine_args(RolloutSettings(), str(model)))
    prompts = [list(range(10 + i % 7, 60)) for i in range(args.prompts)]
    arms: dict[str, Arm] = {}
    meter = FullGcMeter()
    gc.callbacks.append(meter)
    try:
        for heap in ("as loaded", "frozen"):
            phase = {
                f"{name}, heap {heap}": Arm(flat=name == "flat") for name in ("flat", "nested")
            }
            for arm in phase.values():  # warm-up, untimed
                await batch(llm, prompts, args, Arm(flat=arm.flat))
            if heap == "frozen":
                freeze_startup_heap()
            for round_ in range(args.rounds):
                for arm in phase.values() if round_ % 2 == 0 else reversed(phase.values()):
                    meter.arm = arm
                    await batch(llm, prompts, args, arm)
                meter.arm = None
            arms.update(phase)
    finally:
        gc.callbacks.remove(meter)
        llm.shutdown()
    return arms


def report(arms: dict[str, Arm], args: argparse.Namespace) -> str:
    rows = [
        "| arm | frontend CPU ms per 1k tokens, all batches | median batch | per batch | "
        "full GCs | their CPU ms per 1k tokens | CPU ms per 1k tokens without them | "
        "median tokens/s |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {name} | {arm.total_ms_per_1k:.1f} | {arm.median_ms_per_1k:.1f} | "
            f"{', '.join(f'{ms:.1f}' for ms in arm.per_batch_ms_per_1k)} | "
            f"{arm.full_gc} | {arm.ms_per_1k(arm.full_gc_s, sum(arm.tokens)):.1f} | "
            f"{arm.without_full_gc_ms_per_1k:.1f} | "
            f"{arm.median_tokens_per_s:.0f} |"
            for name, arm in arms.items()
        ),
    ]
    flat, nested = arms["flat, heap as loaded"], arms["nested, heap as loaded"]
    frozen = arms["flat, heap frozen"]
    return "\n".join(
        [
            "# vLLM frontend CPU for logprobs: flat against nested",
            "",
            f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} "
            f"({os.cpu_count()} cores), `python -m bench.logprobs_frontend --rounds {args.rounds} "
            f"--prompts {args.prompts} --n {args.n} --max-tokens {args.max_tokens}`: one vLLM "
            "AsyncLLM with the rollout engine's arguments on the tiny model; each batch sends "
            f"{args.prompts} requests at once, n={args.n}, exactly {args.max_tokens} tokens each, "
            "logprob of the sampled token, no detokenizing, final output only (as the rollout "
            "service samples). Frontend CPU: this process's CPU time (vLLM's output handler "
            "decoding every step's outputs and building the logprobs), not the engine's "
            "processes. The arms alternate batch by batch, the order swapped every round. "
            "Python's garbage collector runs when allocations call for it, so a full "
            "(generation 2) collection may land in the batch after the one whose objects caused "
            "it: those are counted apart, with their CPU time. Then the same with the start-up "
            "heap frozen (`services.rollout.app.freeze_startup_heap`, as the rollout service "
            "does once its engine is up).",
            "",
            *rows,
            "",
            f"Frontend CPU of flat relative to nested: all batches "
            f"**{flat.total_ms_per_1k / nested.total_ms_per_1k:.2f}**, median batch "
            f"{flat.median_ms_per_1k / nested.median_ms_per_1k:.2f}; without full "
            f"collections {flat.without_full_gc_ms_per_1k / nested.without_full_gc_ms_per_1k:.2f}. "
            f"Flat with the start-up heap frozen, relative to nested as loaded (before this "
            f"change): **{frozen.total_ms_per_1k / nested.total_ms_per_1k:.2f}**. "
            "Tokens/s is the engine's pace: on an otherwise idle machine it barely moves; the CPU "
            "saved goes to whatever shares the machine with the engine (HTTP, environments, the "
            "trainer).",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    os.environ.update(engine_env(RolloutSettings()))
    with tempfile.TemporaryDirectory(prefix="loom-bench-logprobs-") as work:
        model = ensure_tiny_model(Path(work) / "tiny")
        text = report(asyncio.run(measure(model, args)), args)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
