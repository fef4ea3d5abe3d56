"""Rollout overhead: generation tokens/s when sampling through the Loom gateway + rollout service
(the SDK's `AsyncLoomClient.sample`, base model, on the real local stack) against a bare vLLM
`AsyncLLM` built with the rollout engine's settings, on the same prompts (token ids), sampling
params and concurrency, in the same run. The two never run at once: each round starts one arm,
warms it up, times `--batches` batches, shuts it down fully, then does the same for the other
(the order alternates between rounds). Tokens/s = completion tokens returned / wall time; CPU
seconds per process group are recorded too. `--breakdown` adds batches sent straight to the
rollout service (no gateway). Target: loom / direct ≥ 0.95 (reported, never asserted).
Writes bench/results/rollout_overhead.md (see its header).

    .venv/bin/python -m bench.rollout_overhead [--rounds 3] [--prompts 64] [--n 4]
        [--max-tokens 128] [--batches 3] [--breakdown] [--seed S]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from agents.sdk import AsyncLoomClient, SamplingParams
from agents.tasks.arithmetic import corpus
from bench._stack import local_stack
from services.common.base_models import ensure_tiny_model
from services.common.http import ServiceClient
from services.rollout.engine import engine_args
from services.rollout.sampling import detokenizes_in_engine, span_texts, vllm_params
from services.rollout.schemas import SampleRequest, SampleResponse
from services.rollout.settings import RolloutSettings
from services.rollout.vllm_plugin import BUSY_POLL_ENV

if TYPE_CHECKING:
    from vllm import RequestOutput
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "rollout_overhead.md"
TARGET_RATIO = 0.95
WARMUP_MAX_TOKENS = 16
TEMPERATURE = 1.0
FEW_SHOT = 6  # corpus lines before each question: prompts of ~50-60 tokens


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
        return SamplingParams(max_tokens=max_tokens or self.max_tokens, temperature=TEMPERATURE,
                              seed=seed)


@dataclass
class ArmRun:
    """The timed batches of one arm in one round (one engine start). CPU seconds are summed
    over the batches' wall times."""

    arm: str  # "direct" | "loom" | "loom, no gateway"
    round: int
    position: int  # 1: ran first in its round
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

    def add_batch(self, wall_s: float, samples: list[list[list[int]]],
                  reasons: list[str]) -> None:
        self.walls.append(wall_s)
        self.batch_tokens.append(sum(len(s) for request in samples for s in request))
        if not self.samples:
            self.samples = samples
        for reason in reasons:
            self.stop_reasons[reason] = self.stop_reasons.get(reason, 0) + 1


# --- prompts and model ----------------------------------------------------------------------

def make_workload(model_dir: Path, prompts: int, n: int, max_tokens: int,
                  seed0: int | None) -> Workload:
    """Arithmetic few-shot prompts from the task corpus, tokenized with the model's tokenizer
    (the same token ids go to both arms)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lines = corpus()
    texts = []
    for i in range(prompts):
        shots = [lines[(i * FEW_SHOT + k) * 7 % len(lines)] for k in range(FEW_SHOT)]
        question = lines[(i * 13 + 5) % len(lines)].split("=")[0] + "="
        texts.append("".join(shots) + question)
    ids = [list(tokenizer.encode(text, add_special_tokens=False)) for text in texts]
    return Workload(prompts=ids, n=n, max_tokens=max_tokens, seed0=seed0)


# --- CPU accounting -------------------------------------------------------------------------

def tree_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of a process, and of all its descendants."""
    try:
        proc = psutil.Process(pid)
        own = sum(proc.cpu_times()[:2])
        children = proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0.0, 0.0
    spawned = 0.0
    for child in children:
        with suppress(psutil.NoSuchProcess):
            spawned += sum(child.cpu_times()[:2])
    return own, spawned


def machine_busy_s() -> float:
    times = psutil.cpu_times()
    return times.user + times.nice + times.system + times.irq + times.softirq + times.steal


class CpuMeter:
    """CPU seconds each named group of processes spends between `start` and `stop`."""

    def __init__(self, groups: dict[str, tuple[int, str]]) -> None:
        self.groups = groups  # name → (pid, "own" | "spawned" | "tree")
        self.before: dict[str, float] = {}
        self.busy_before = 0.0

    def read(self) -> dict[str, float]:
        values = {}
        for name, (pid, part) in self.groups.items():
            own, spawned = tree_cpu(pid)
            values[name] = {"own": own, "spawned": spawned, "tree": own + spawned}[part]
        return values

    def start(self) -> None:
        self.before = self.read()
        self.busy_before = machine_busy_s()

    def stop(self, run: ArmRun) -> None:
        """Add the CPU seconds since `start` to `run`'s."""
        after = self.read()
        for name in self.groups:
            run.cpu[name] = run.cpu.get(name, 0.0) + after[name] - self.before[name]
        run.cpu_total_s += machine_busy_s() - self.busy_before


# --- the direct arm: a bare AsyncLLM in its own process ---------------------------------------

def engine_env(settings: RolloutSettings) -> dict[str, str]:
    """What the rollout engine sets in its environment before vLLM spawns its processes."""
    return {"VLLM_CPU_KVCACHE_SPACE": str(settings.rollout_kv_cache_gib),
            BUSY_POLL_ENV: str(settings.rollout_cpu_busy_poll_ms)}


async def direct_generate(llm: AsyncLLM, prompt: list[int],
                          params: VllmSamplingParams) -> RequestOutput:
    final = None
    async for output in llm.generate({"prompt_token_ids": prompt}, params, uuid.uuid4().hex):
        final = output
    assert final is not None
    return final


async def direct_batch(llm: AsyncLLM, workload: Workload, max_tokens: int | None = None
                       ) -> list[RequestOutput]:
    """The whole workload at once, with the service's own params and texts (`vllm_params`:
    logprobs=0, final output only, detokenized as the service does it, `span_texts`)."""
    tokenizer = llm.get_tokenizer()
    detokenize = detokenizes_in_engine(tokenizer)
    params = [vllm_params(workload.params(i, max_tokens), n=workload.n, detokenize=detokenize)
              for i in range(len(workload.prompts))]
    outputs = await asyncio.gather(*(direct_generate(llm, prompt, p) for prompt, p
                                     in zip(workload.prompts, params, strict=True)))
    for output in outputs:
        for completion in output.outputs:
            completion.text = span_texts(tokenizer, output.prompt_token_ids or [], completion,
                                         [(0, len(completion.token_ids))])[0]
    return outputs


async def direct_arm(model_dir: str, workload: Workload, batches: int, run: ArmRun) -> None:
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    started = time.perf_counter()
    llm = AsyncLLM.from_engine_args(engine_args(RolloutSettings(), model_dir))
    try:
        # The rollout engine's own warm-up (RolloutEngine._warm_up), then the bench's.
        prompt = [0, 1, 2, 3]
        await direct_generate(llm, prompt, VllmSamplingParams(max_tokens=2, logprobs=0))
        await direct_generate(llm, prompt, VllmSamplingParams(max_tokens=2, logprobs=0, n=2,
                                                              seed=0))
        await direct_generate(llm, prompt, VllmSamplingParams(max_tokens=2, logprobs=0,
                                                              top_p=0.9, top_k=8))
        await direct_batch(llm, workload, WARMUP_MAX_TOKENS)
        run.startup_s = time.perf_counter() - started
        me = os.getpid()
        meter = CpuMeter({"engine core": (me, "spawned"), "frontend": (me, "own")})
        for _ in range(batches):
            meter.start()
            begin = time.perf_counter()
            outputs = await direct_batch(llm, workload)
            wall = time.perf_counter() - begin
            meter.stop(run)
            completions = [sorted(o.outputs, key=lambda c: c.index) for o in outputs]
            run.add_batch(wall, [[list(c.token_ids) for c in cs] for cs in completions],
                          [str(c.finish_reason) for cs in completions for c in cs])
    finally:
        llm.shutdown()


def direct_worker(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    run = ArmRun(arm="direct", round=spec["round"], position=spec["position"])
    asyncio.run(direct_arm(spec["model_dir"], Workload(**spec["workload"]), spec["batches"],
                           run))
    Path(out_path).write_text(json.dumps(asdict(run)))


def run_direct(model_dir: Path, workload: Workload, work: Path, round_: int, position: int,
               args: argparse.Namespace) -> list[ArmRun]:
    """The direct arm in a subprocess of its own session (vLLM spawns processes); whatever
    it leaves behind in its process group is killed before the next arm starts."""
    spec, out = work / f"direct-{round_}.json", work / f"direct-{round_}.out.json"
    spec.write_text(json.dumps({"model_dir": str(model_dir), "workload": asdict(workload),
                                "round": round_, "position": position,
                                "batches": args.batches}))
    argv = [sys.executable, "-m", "bench.rollout_overhead", "--direct-worker", str(spec),
            str(out)]
    env = {**os.environ, **engine_env(RolloutSettings())}
    with open(work / "direct.log", "ab") as sink:
        process = subprocess.Popen(argv, env=env, cwd=REPO, stdout=sink,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = process.wait(timeout=900)
        finally:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    if code != 0:
        raise RuntimeError(f"direct worker failed ({code}); see {work / 'direct.log'}")
    return [ArmRun(**json.loads(out.read_text()))]


# --- the Loom arm: the local stack, sampled through the gateway with the SDK -------------------

async def loom_batch(client: AsyncLoomClient, workload: Workload,
                     max_tokens: int | None = None) -> list[SampleResponse]:
    requests = [SampleRequest(prompt_token_ids=prompt, n=workload.n,
                              params=workload.params(i, max_tokens))
                for i, prompt in enumerate(workload.prompts)]
    return await asyncio.gather(*(client.sample(request) for request in requests))


async def rollout_batch(client: ServiceClient, workload: Workload) -> list[SampleResponse]:
    """The same requests straight to the rollout service (no gateway, no SDK)."""
    async def one(i: int, prompt: list[int]) -> SampleResponse:
        request = SampleRequest(prompt_token_ids=prompt, n=workload.n, params=workload.params(i))
        body = await client.post_json("/v1/sample", request.model_dump(mode="json"))
        return SampleResponse.model_validate(body)

    return await asyncio.gather(*(one(i, p) for i, p in enumerate(workload.prompts)))


def add_responses(run: ArmRun, wall_s: float, responses: list[SampleResponse]) -> None:
    run.add_batch(wall_s, [[list(s.token_ids) for s in r.samples] for r in responses],
                  [s.stop_reason for r in responses for s in r.samples])


async def loom_timed(url: str, key: str, rollout_url: str, workload: Workload, batches: int,
                     meter: CpuMeter, runs: list[ArmRun]) -> None:
    """Timed batches through the gateway (and, with a second run, straight to rollout,
    alternating with them)."""
    async with AsyncLoomClient(url, key) as client:
        rollout = ServiceClient(rollout_url, service="rollout")
        try:
            await loom_batch(client, workload, WARMUP_MAX_TOKENS)
            for _ in range(batches):
                for run in runs:
                    meter.start()
                    begin = time.perf_counter()
                    responses = await (loom_batch(client, workload) if run.arm == "loom"
                                       else rollout_batch(rollout, workload))
                    wall = time.perf_counter() - begin
                    meter.stop(run)
                    add_responses(run, wall, responses)
        finally:
            await rollout.aclose()


def run_loom(model_dir: Path, workload: Workload, work: Path, round_: int, position: int,
             args: argparse.Namespace) -> list[ArmRun]:
    runs = [ArmRun(arm="loom", round=round_, position=position)]
    if args.breakdown:
        runs.append(ArmRun(arm="loom, no gateway", round=round_, position=position))
    started = time.perf_counter()
    with local_stack(work, {"LOOM_ROLLOUT_MODEL": str(model_dir)}) as stack:
        pids = {s.name: s.pid for s in stack.supervisor.services}
        groups = {"engine core": (pids["rollout"], "spawned"),
                  "rollout service": (pids["rollout"], "own"),
                  "gateway": (pids["gateway"], "tree"),
                  "client (SDK)": (os.getpid(), "own")}
        groups.update({f"idle {name}": (pid, "tree") for name, pid in pids.items()
                       if name not in ("rollout", "gateway")})
        for run in runs:
            run.startup_s = time.perf_counter() - started
        asyncio.run(loom_timed(stack.settings.gateway_url, stack.api_key,
                               stack.settings.url_of("rollout"), workload, args.batches,
                               CpuMeter(groups), runs))
    return runs


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
    versions = ", ".join(f"{name} {package_version(name)}" for name in ("vllm-cpu", "vllm", "torch")
                         if package_version(name))
    return (f"{os.cpu_count()} CPU cores ({model}), {memory:.0f} GiB RAM, no GPU; {versions}; "
            f"Python {platform.python_version()}")


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def same_samples(a: ArmRun, b: ArmRun) -> tuple[int, int]:
    pairs = [(x, y) for ra, rb in zip(a.samples, b.samples, strict=True)
             for x, y in zip(ra, rb, strict=True)]
    return sum(x == y for x, y in pairs), len(pairs)


CPU_COLUMNS = ["engine core", "frontend", "rollout service", "gateway", "client (SDK)"]


def run_line(run: ArmRun) -> str:
    samples = sum(len(r) for r in run.samples) * len(run.walls)
    idle_cpu = [v for k, v in run.cpu.items() if k.startswith("idle ")]
    idle = f"{sum(idle_cpu):.1f}" if idle_cpu else "–"
    cells = [f"{run.cpu[c]:.1f}" if c in run.cpu else "–" for c in CPU_COLUMNS]
    batches = ", ".join(f"{t / w:.0f}" for t, w in zip(run.batch_tokens, run.walls, strict=True))
    return (f"| {run.round} | {run.arm} | {run.position} | {run.startup_s:.0f} | {samples} | "
            f"{run.tokens} | {run.tokens / samples:.1f} | {run.wall_s:.2f} | "
            f"**{run.tokens_per_s:.0f}** | {batches} | " + " | ".join(cells)
            + f" | {idle} | {run.cpu_total_s - run.our_cpu_s:.1f} | {run.cpu_total_s:.1f} | "
            f"{run.cpu_ms_per_1k():.0f} |")


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

    return ["| CPU ms per 1k tokens | " + " | ".join(arms) + " |",
            "|---|" + "---|" * len(arms),
            *(f"| {g} | " + " | ".join(cell(runs, g) for runs in arms.values()) + " |"
              for g in groups)]


def report(runs: list[ArmRun], args: argparse.Namespace, workload: Workload, command: str,
           model_dir: Path, wall_s: float) -> str:
    arms = {name: [r for r in runs if r.arm == name]
            for name in ("direct", "loom", "loom, no gateway")}
    arms = {name: arm_runs for name, arm_runs in arms.items() if arm_runs}
    medians = {name: median_of(arm_runs, lambda r: r.tokens_per_s)
               for name, arm_runs in arms.items()}
    ratio = medians["loom"] / medians["direct"]
    best = {name: max(t / w for r in arm_runs
                      for t, w in zip(r.batch_tokens, r.walls, strict=True))
            for name, arm_runs in arms.items()}

    def in_round(name: str, k: int) -> ArmRun:
        return next(r for r in arms[name] if r.round == k)

    rounds = range(1, args.rounds + 1)
    per_round = [in_round("loom", k).tokens_per_s / in_round("direct", k).tokens_per_s
                 for k in rounds]
    same = [same_samples(in_round("direct", k), in_round("loom", k)) for k in rounds]
    prompt_lens = [len(p) for p in workload.prompts]
    seeding = ("unseeded (the SDK's default; see --seed)" if workload.seed0 is None
               else f"seed {workload.seed0}+i for request i")
    settings = RolloutSettings()
    try:
        shown_model = model_dir.relative_to(REPO)
    except ValueError:
        shown_model = model_dir
    result_rows = [
        f"| {name} | {medians[name]:.0f} | "
        + ", ".join(f"{r.tokens_per_s:.0f}" for r in arm_runs) + " |"
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
        "logprobs of the sampled tokens, base model `loom/tiny` (built by modelstate/tiny.py: "
        f"random-init Qwen2-style, float32, in {shown_model}). Prompts: arithmetic few-shot "
        f"text from the task corpus, {min(prompt_lens)}–{max(prompt_lens)} tokens, the same "
        f"token ids in both arms. {args.rounds} rounds; in each, every arm starts its engine, "
        f"warms up, and times {args.batches} batches back to back.",
        "",
        "- **loom**: the real local stack (every service a local process, embedded defaults, "
        "`gateway.cli.supervisor.Supervisor`), sampled with the SDK "
        "(`AsyncLoomClient.sample(SampleRequest(...))`, job_id None = the base model) "
        "through the gateway → rollout `/v1/sample` → its `AsyncLLM`.",
        *(["- **loom, no gateway** (--breakdown): the same stack and requests, posted straight "
           "to the rollout service's `/v1/sample` (httpx2, no gateway, no SDK), its batches "
           "alternating with the gateway's."] if "loom, no gateway" in arms else []),
        "- **direct**: a bare `vllm.v1.engine.async_llm.AsyncLLM` in a process of its own, "
        "built with the rollout engine's `AsyncEngineArgs` (dtype "
        f"{settings.rollout_dtype}, enforce_eager={settings.rollout_enforce_eager}, "
        f"max_model_len {settings.rollout_max_model_len}, LoRA on (max rank "
        f"{settings.rollout_max_lora_rank}, {settings.rollout_max_loras} slots), seed "
        f"{settings.rollout_seed}) and its environment (VLLM_CPU_KVCACHE_SPACE="
        f"{settings.rollout_kv_cache_gib}, {BUSY_POLL_ENV}={settings.rollout_cpu_busy_poll_ms:g}"
        "), given the service's own vLLM SamplingParams (`services.rollout.sampling."
        "vllm_params`: logprobs=0, final output only, no detokenizing in vLLM), `generate()` "
        "per request, all at once, then each sample's text made as the service makes it "
        "(`services.rollout.sampling.span_texts`, once per sample).",
        "- Warm-up, each arm, after its engine starts: the rollout engine's own warm-up "
        f"(repeated in the direct arm), then one untimed batch at max_tokens="
        f"{WARMUP_MAX_TOKENS}. After its timed batches an arm is shut down completely before "
        "the other starts (never both at once); the order alternates between rounds "
        "(position 1 = ran first).",
        "- CPU s: user+system CPU seconds over the timed batches, from /proc: *engine core* = "
        "the processes vLLM spawned (EngineCore and its worker, with the model); *frontend* = "
        "the direct arm's own process (AsyncLLM input/output processing, detokenizing); "
        "*rollout service* = the rollout process (uvicorn, pydantic, the same AsyncLLM "
        "frontend); *gateway*; *client* = this script's process (SDK, httpx2); *idle services* "
        "= modelstate, trainer, reward, sandbox; *other* = the machine's busy time minus all "
        "of those: other work on the machine (tests, daemons) — when it is large, the round "
        "is noisy.",
        "",
        "## Result",
        "",
        f"Target: ratio (loom / direct, medians over rounds of tokens/s) ≥ {TARGET_RATIO}.",
        "",
        "| arm | median tokens/s | per round |",
        "|---|---|---|",
        *result_rows,
        f"| **ratio loom / direct** | **{ratio:.3f} {'PASS' if ratio >= TARGET_RATIO else 'FAIL'}"
        f"** (target ≥ {TARGET_RATIO}) | " + ", ".join(f"{x:.3f}" for x in per_round) + " |",
        f"| best batch loom / direct | {best['loom'] / best['direct']:.3f} | best batch "
        "tokens/s (the one least disturbed by other work): "
        + ", ".join(f"{name} {value:.0f}" for name, value in best.items()) + " |",
        "",
        ("Identical samples in both arms (same seeds, token for token), per round: "
         + ", ".join(f"{a}/{b}" for a, b in same) + ".") if workload.seed0 is not None else
        "Unseeded, so the arms' samples differ; their lengths are comparable (the random-init "
        "model rarely samples EOS) and tokens/s counts the tokens each arm really returned.",
        "",
        *cpu_lines(arms),
        "",
        "## Per round",
        "",
        "| round | arm | position | start-up + warm-up s | samples | completion tokens "
        "| mean tokens/sample | wall s | tokens/s | per batch | CPU s engine core "
        "| CPU s frontend | CPU s rollout service | CPU s gateway | CPU s client "
        "| CPU s idle services | CPU s other | CPU s machine | arm's CPU ms per 1k tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(run_line(r) for r in sorted(runs, key=lambda r: (r.round, r.position))),
        "",
        "Stop reasons: " + "; ".join(
            f"round {r.round} {r.arm}: " + ", ".join(f"{k} {v}" for k, v in
                                                   sorted(r.stop_reasons.items()))
            for r in sorted(runs, key=lambda r: (r.round, r.position))) + ".",
        "",
        f"Total wall time: {wall_s:.0f} s.",
    ]
    return "\n".join(lines) + "\n"


# --- main -----------------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=64, help="Requests sent at once.")
    parser.add_argument("--n", type=int, default=4, help="Samples per request.")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batches", type=int, default=3,
                        help="Timed batches per arm per round (one engine start).")
    parser.add_argument("--breakdown", action="store_true",
                        help="Also time the same batches sent straight to the rollout service "
                        "(no gateway, no SDK), alternating with the gateway's, in the Loom arm.")
    parser.add_argument(
        "--seed", type=int, default=None,
        help="Seed request i with SEED+i (both arms then return the same samples). Default: "
        "unseeded. vLLM-cpu 0.32 kills its engine when a seeded request's prefill is chunked "
        "(`CPU Generator does not use offset`): past ~2048 prompt tokens in flight.")
    parser.add_argument("--models-dir", type=Path,
                        default=REPO / ".loom-test-cache" / "bench-models")
    parser.add_argument("--out", type=Path, default=RESULTS, help="Where the table goes.")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="Keep data dirs and logs here (default: a temp dir, removed).")
    parser.add_argument("--direct-worker", nargs=2, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.direct_worker:
        direct_worker(*args.direct_worker)
        return
    started = time.perf_counter()
    command = shlex.join([".venv/bin/python", "-m", "bench.rollout_overhead", *sys.argv[1:]])
    model_dir = ensure_tiny_model(args.models_dir / "tiny")
    workload = make_workload(model_dir, args.prompts, args.n, args.max_tokens, args.seed)
    runs: list[ArmRun] = []
    with tempfile.TemporaryDirectory(prefix="loom-bench-") as temp:
        work = args.work_dir or Path(temp)
        work.mkdir(parents=True, exist_ok=True)
        for round_ in range(1, args.rounds + 1):
            arms = ["direct", "loom"] if round_ % 2 else ["loom", "direct"]
            for position, arm in enumerate(arms, start=1):
                for run in (run_direct if arm == "direct" else run_loom)(
                        model_dir, workload, work, round_, position, args):
                    runs.append(run)
                    print(f"round {round_} {run.arm}: {run.tokens} tokens in "
                          f"{run.wall_s:.2f} s = {run.tokens_per_s:.0f} tokens/s (batches: "
                          + ", ".join(f"{t / w:.0f}" for t, w in
                                      zip(run.batch_tokens, run.walls, strict=True))
                          + f"; start-up {run.startup_s:.0f} s)", file=sys.stderr, flush=True)
    text = report(runs, args, workload, command, model_dir, time.perf_counter() - started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
