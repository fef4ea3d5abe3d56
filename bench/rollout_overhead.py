"""Rollout overhead: generation tokens/s when sampling through the Loom gateway + rollout service
(the SDK's `AsyncLoomClient.sample`, base model, on the real local stack) against a bare vLLM
`AsyncLLM` built with the rollout engine's settings, on the same prompts (token ids), sampling
params and concurrency, in the same run. Each round starts both arms, warms them up, then times
`--batches` batches of each, taking turns batch by batch (the two never sample at once), so a
machine whose speed drifts over minutes slows both alike. Tokens/s = completion tokens
returned / wall time, over all timed batches; CPU seconds per process group are recorded too.
`--breakdown` adds batches sent straight to the rollout service (no gateway). Target:
loom / direct ≥ 0.95 (reported, never asserted). Writes bench/results/rollout_overhead.md (see
its header).

Placement: by default each arm's engine (vLLM's EngineCore and worker processes, one OMP
thread) has core 0 to itself, the way an engine has its GPU, and everything that feeds it (the
direct arm's own process; Loom's rollout service, gateway, SDK client and idle services) shares
the other cores, the way a GPU node's host CPUs do. `--no-pin` lets every process of both arms
share every core, so Loom's CPU is taken from the engine's compute (then the ratio mostly
measures CPU per token: see the CPU table).

    .venv/bin/python -m bench.rollout_overhead [--rounds 3] [--prompts 64] [--n 4]
        [--max-tokens 128] [--batches 3] [--breakdown] [--seed S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import psutil

from agents.sdk import AsyncLoomClient
from bench._stack import LocalStack, local_stack, pin_threads
from bench.rollout_overhead_report import (
    WARMUP_MAX_TOKENS,
    ArmRun,
    Workload,
    report,
)
from services.common.base_models import ensure_tiny_model
from services.common.service_token import client_of
from services.common.tiny_model import corpus
from services.rollout.client import RolloutClient
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
FEW_SHOT = 6  # corpus lines before each question: prompts of ~50-60 tokens


# --- prompts and model ----------------------------------------------------------------------


def make_workload(
    model_dir: Path, prompts: int, n: int, max_tokens: int, seed0: int | None
) -> Workload:
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


# --- placement: the engines' core, and the cores of what feeds them ---------------------------


@dataclass(frozen=True)
class Placement:
    """Where each arm's processes run; `None`: anywhere (`--no-pin`)."""

    engine: list[int] | None = None  # vLLM's EngineCore and worker, their OMP thread bound
    frontend: list[int] | None = None  # every other process of either arm

    @classmethod
    def of(cls, pin: bool) -> Placement:
        cores = os.cpu_count() or 1
        return cls([0], list(range(1, cores))) if pin and cores >= 2 else cls()

    def engine_env(self) -> dict[str, str]:
        """vLLM binds its worker's OMP threads to these cores (one thread each)."""
        if self.engine is None:
            return {}
        return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, self.engine))}

    def describe(self) -> str:
        if self.engine is None:
            return (
                "No core placement (`--no-pin`): every process of both arms may run on "
                "every core, so the CPU Loom's processes use is taken from the engine's "
                "compute."
            )
        return (
            f"Placement: each arm's engine (vLLM's EngineCore and worker processes, one "
            f"OMP thread bound to core {self.engine[0]}) has core(s) "
            f"{', '.join(map(str, self.engine))} to itself, as an engine has its GPU; "
            "everything that feeds it (the direct arm's own process; Loom's rollout "
            "service, gateway, SDK client and idle services) runs on core(s) "
            f"{', '.join(map(str, self.frontend or []))}, as on a GPU node's host CPUs. "
            "`--no-pin` measures with every process on every core."
        )


# --- the direct arm: a bare AsyncLLM in its own process ---------------------------------------


def engine_env(settings: RolloutSettings) -> dict[str, str]:
    """What the rollout engine sets in its environment before vLLM spawns its processes (the
    KV cache's size travels in `engine_args`)."""
    return {BUSY_POLL_ENV: str(settings.rollout_cpu_busy_poll_ms)}


async def direct_generate(
    llm: AsyncLLM, prompt: list[int], params: VllmSamplingParams
) -> RequestOutput:
    final = None
    async for output in llm.generate({"prompt_token_ids": prompt}, params, uuid.uuid4().hex):
        final = output
    assert final is not None
    return final


async def direct_batch(
    llm: AsyncLLM, workload: Workload, max_tokens: int | None = None
) -> list[RequestOutput]:
    """The whole workload at once, with the service's own params and texts (`vllm_params`:
    logprobs=0, final output only, detokenized as the service does it, `span_texts`)."""
    tokenizer = llm.get_tokenizer()
    detokenize = detokenizes_in_engine(tokenizer)
    params = [
        vllm_params(workload.params(i, max_tokens), n=workload.n, detokenize=detokenize)
        for i in range(len(workload.prompts))
    ]
    outputs = await asyncio.gather(
        *(
            direct_generate(llm, prompt, p)
            for prompt, p in zip(workload.prompts, params, strict=True)
        )
    )
    for output in outputs:
        for completion in output.outputs:
            completion.text = span_texts(
                tokenizer,
                output.prompt_token_ids or [],
                completion,
                [(0, len(completion.token_ids))],
            )[0]
    return outputs


async def direct_serve(
    model_dir: str, workload: Workload, commands: BinaryIO, results: BinaryIO
) -> None:
    """Start and warm up a bare AsyncLLM, then time one batch per line read from `commands`
    (until EOF), writing a JSON line to `results` after start-up and after each batch."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    def reply(message: dict[str, Any]) -> None:
        results.write(json.dumps(message).encode() + b"\n")
        results.flush()

    started = time.perf_counter()
    llm = AsyncLLM.from_engine_args(engine_args(RolloutSettings(), model_dir))
    try:
        # The rollout engine's own warm-up (RolloutEngine._warm_up), then the bench's.
        prompt = [0, 1, 2, 3]
        await direct_generate(llm, prompt, VllmSamplingParams(max_tokens=2, logprobs=0))
        await direct_generate(
            llm, prompt, VllmSamplingParams(max_tokens=2, logprobs=0, n=2, seed=0)
        )
        await direct_generate(
            llm, prompt, VllmSamplingParams(max_tokens=2, logprobs=0, top_p=0.9, top_k=8)
        )
        await direct_batch(llm, workload, WARMUP_MAX_TOKENS)
        reply({"startup_s": time.perf_counter() - started})
        while await asyncio.to_thread(commands.readline):
            begin = time.perf_counter()
            outputs = await direct_batch(llm, workload)
            wall = time.perf_counter() - begin
            completions = [sorted(o.outputs, key=lambda c: c.index) for o in outputs]
            reply(
                {
                    "wall_s": wall,
                    "samples": [[list(c.token_ids) for c in cs] for cs in completions],
                    "reasons": [str(c.finish_reason) for cs in completions for c in cs],
                }
            )
    finally:
        llm.shutdown()


class DirectEngine:
    """The direct arm: `direct_serve` in a subprocess of its own session (vLLM spawns
    processes), driven over two pipes; whatever it leaves behind in its process group is
    killed on exit. Placed: it starts on the engine's cores (vLLM's processes inherit them),
    then its own threads move to the frontend's."""

    def __init__(
        self, model_dir: Path, workload: Workload, work: Path, placement: Placement
    ) -> None:
        self.placement = placement
        spec = work / "direct-workload.json"
        spec.write_text(json.dumps(asdict(workload)))
        commands_in, self._commands = os.pipe()
        self._results, results_out = os.pipe()
        argv = [
            sys.executable,
            "-m",
            "bench.rollout_overhead",
            "--direct-worker",
            str(model_dir),
            str(spec),
            str(commands_in),
            str(results_out),
        ]
        env = {**os.environ, **engine_env(RolloutSettings()), **placement.engine_env()}
        engine_cores = placement.engine
        self.log = work / "direct.log"
        with open(self.log, "ab") as sink:
            self.process = subprocess.Popen(
                argv,
                env=env,
                cwd=REPO,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(commands_in, results_out),
                preexec_fn=None
                if engine_cores is None
                else lambda: os.sched_setaffinity(0, engine_cores),
            )
        os.close(commands_in)
        os.close(results_out)
        self.startup_s = 0.0

    def __enter__(self) -> DirectEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._commands)  # EOF: the worker shuts its engine down and exits
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=60)
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        os.close(self._results)

    def _read(self) -> dict[str, Any]:
        line = b""
        while not line.endswith(b"\n"):
            chunk = os.read(self._results, 1 << 20)
            if not chunk:
                raise RuntimeError(f"direct worker exited ({self.process.poll()}); see {self.log}")
            line += chunk
        return json.loads(line)

    def ready(self) -> None:
        self.startup_s = self._read()["startup_s"]
        if self.placement.frontend is not None:
            pin_threads(self.process.pid, self.placement.frontend)

    def batch(self) -> dict[str, Any]:
        os.write(self._commands, b"batch\n")
        return self._read()


def direct_worker(model_dir: str, spec: str, commands_fd: str, results_fd: str) -> None:
    workload = Workload(**json.loads(Path(spec).read_text()))
    with open(int(commands_fd), "rb") as commands, open(int(results_fd), "wb") as results:
        asyncio.run(direct_serve(model_dir, workload, commands, results))


# --- the Loom arm: the local stack, sampled through the gateway with the SDK -------------------


async def loom_batch(
    client: AsyncLoomClient, workload: Workload, max_tokens: int | None = None
) -> list[SampleResponse]:
    requests = [
        SampleRequest(prompt_token_ids=prompt, n=workload.n, params=workload.params(i, max_tokens))
        for i, prompt in enumerate(workload.prompts)
    ]
    return await asyncio.gather(*(client.sample(request) for request in requests))


async def rollout_batch(client: RolloutClient, workload: Workload) -> list[SampleResponse]:
    """The same requests straight to the rollout service (no gateway, no SDK)."""

    async def one(i: int, prompt: list[int]) -> SampleResponse:
        request = SampleRequest(prompt_token_ids=prompt, n=workload.n, params=workload.params(i))
        return await client.sample(request)

    return await asyncio.gather(*(one(i, p) for i, p in enumerate(workload.prompts)))


def add_responses(run: ArmRun, wall_s: float, responses: list[SampleResponse]) -> None:
    run.add_batch(
        wall_s,
        [[list(s.token_ids) for s in r.samples] for r in responses],
        [s.stop_reason for r in responses for s in r.samples],
    )


# --- a round: both arms up, their batches interleaved ------------------------------------------


async def timed_batches(
    stack: LocalStack,
    direct: DirectEngine,
    workload: Workload,
    runs: list[ArmRun],
    batches: int,
    round_: int,
) -> None:
    """`batches` batches of every arm, taking turns batch by batch (who goes first alternates),
    so that every arm's batches see the machine as it is at that minute."""
    pids = {s.name: s.pid for s in stack.supervisor.services}
    loom_groups = {
        "engine core": (pids["rollout"], "spawned"),
        "rollout service": (pids["rollout"], "own"),
        "gateway": (pids["gateway"], "tree"),
        "client (SDK)": (os.getpid(), "own"),
    }
    loom_groups.update(
        {
            f"idle {name}": (pid, "tree")
            for name, pid in pids.items()
            if name not in ("rollout", "gateway")
        }
    )
    meters = {
        "direct": CpuMeter(
            {
                "engine core": (direct.process.pid, "spawned"),
                "frontend": (direct.process.pid, "own"),
            }
        ),
        "loom": CpuMeter(loom_groups),
        "loom, no gateway": CpuMeter(loom_groups),
    }
    async with AsyncLoomClient(stack.settings.gateway_url, stack.api_key) as client:
        rollout = client_of(stack.settings, RolloutClient)
        try:
            await loom_batch(client, workload, WARMUP_MAX_TOKENS)
            for batch in range(batches):
                order = runs if (round_ + batch) % 2 else runs[::-1]
                for run in order:
                    meter = meters[run.arm]
                    meter.start()
                    if run.arm == "direct":
                        result = await asyncio.to_thread(direct.batch)
                        meter.stop(run)
                        run.add_batch(result["wall_s"], result["samples"], result["reasons"])
                        continue
                    begin = time.perf_counter()
                    responses = await (
                        loom_batch(client, workload)
                        if run.arm == "loom"
                        else rollout_batch(rollout, workload)
                    )
                    wall = time.perf_counter() - begin
                    meter.stop(run)
                    add_responses(run, wall, responses)
        finally:
            await rollout.aclose()


def run_round(
    model_dir: Path,
    workload: Workload,
    work: Path,
    round_: int,
    args: argparse.Namespace,
    placement: Placement,
) -> list[ArmRun]:
    """Start both arms (one after the other: start-up times are each arm's own), then time
    their batches interleaved."""
    runs = [ArmRun(arm="direct", round=round_), ArmRun(arm="loom", round=round_)]
    if args.breakdown:
        runs.append(ArmRun(arm="loom, no gateway", round=round_))
    # The rollout service starts on the engine's cores, so vLLM's processes inherit them;
    # once it is up, its own threads move to the frontend's (the other services inherit this
    # process's placement).
    cores = None if placement.engine is None else {"rollout": placement.engine}
    env = {"LOOM_ROLLOUT_MODEL": str(model_dir), **placement.engine_env()}
    with DirectEngine(model_dir, workload, work, placement) as direct:
        direct.ready()
        runs[0].startup_s = direct.startup_s
        started = time.perf_counter()
        with local_stack(work, env, cores) as stack:
            if placement.frontend is not None:
                pin_threads(stack.pid("rollout"), placement.frontend)
            for run in runs[1:]:
                run.startup_s = time.perf_counter() - started
            asyncio.run(timed_batches(stack, direct, workload, runs, args.batches, round_))
    return runs


# --- main -----------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="No core placement: every process of both arms on every core.",
    )
    parser.add_argument("--prompts", type=int, default=64, help="Requests sent at once.")
    parser.add_argument("--n", type=int, default=4, help="Samples per request.")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--batches", type=int, default=3, help="Timed batches per arm per round (one engine start)."
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="Also time the same batches sent straight to the rollout service "
        "(no gateway, no SDK), alternating with the gateway's, in the Loom arm.",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="Seed request i with SEED+i (both arms then return the same samples). Default: "
        "unseeded. vLLM-cpu 0.32 kills its engine when a seeded request's prefill is chunked "
        "(`CPU Generator does not use offset`): past ~2048 prompt tokens in flight.",
    )
    parser.add_argument(
        "--models-dir", type=Path, default=REPO / ".loom-test-cache" / "bench-models"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="Where the table goes.")
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="Keep data dirs and logs here (default: a temp dir, removed).",
    )
    parser.add_argument("--direct-worker", nargs=4, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.direct_worker:
        direct_worker(*args.direct_worker)
        return
    started = time.perf_counter()
    placement = Placement.of(args.pin)
    if placement.frontend is not None:  # this process is the Loom arm's client
        os.sched_setaffinity(0, placement.frontend)
    command = shlex.join([".venv/bin/python", "-m", "bench.rollout_overhead", *sys.argv[1:]])
    model_dir = ensure_tiny_model(args.models_dir / "tiny")
    workload = make_workload(model_dir, args.prompts, args.n, args.max_tokens, args.seed)
    runs: list[ArmRun] = []
    with tempfile.TemporaryDirectory(prefix="loom-bench-") as temp:
        work = args.work_dir or Path(temp)
        work.mkdir(parents=True, exist_ok=True)
        for round_ in range(1, args.rounds + 1):
            for run in run_round(model_dir, workload, work, round_, args, placement):
                runs.append(run)
                print(
                    f"round {round_} {run.arm}: {run.tokens} tokens in "
                    f"{run.wall_s:.2f} s = {run.tokens_per_s:.0f} tokens/s (batches: "
                    + ", ".join(
                        f"{t / w:.0f}" for t, w in zip(run.batch_tokens, run.walls, strict=True)
                    )
                    + f"; start-up {run.startup_s:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    text = report(
        runs,
        args,
        workload,
        command,
        model_dir,
        placement.describe(),
        time.perf_counter() - started,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
