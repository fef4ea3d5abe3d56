r"""Issue 35 on one GPU (CI has none: run it where one is). Two parts, one run:

1. Full fine-tuning of a random-init Qwen2.5-1.5B-shaped model at world size 1 through the
   sharded trainer's rank path (what a rank of the service runs: `rank.join`, then a
   `ModelRegistry` of `Sharded` models) with `LOOM_TRAINER_PRECISION=bf16` and activation
   checkpointing: bf16 compute, fp32 master weights, gradients and AdamW moments. Its tokens/s
   against a hand-written torch step with the same policy (fp32 weights, bf16 autocast,
   gradient checkpointing, AdamW) on the same model and data in the same run, and each one's
   peak GPU memory (torch.cuda.max_memory_allocated). (The service runs this path whenever
   bf16, activation checkpointing or CPU offload is set, at any `LOOM_TRAINER_WORLD_SIZE`.)
2. LoRA on Qwen2.5 shapes in ascending order (0.5B, 1.5B, 3B, 7B, 14B, 32B, 72B), through the
   same path and policy, until one does not fit: peak memory and tokens/s of each.

Every model is built here with random weights (`bench/_qwen.py`; nothing is downloaded) and
every arm and try runs in a forked child (`bench/_forked.py`), so a try that runs out of
memory leaves nothing behind for the next. A shape whose fp32 base alone exceeds the GPU's
memory, the host's free memory (the rank reads the base whole into it) or the free disk (its
bf16 files) is not tried; nor is one once `--budget-s` is spent.

On the device machine: torch, peft and transformers are there; what the trainer's imports need
beyond them (pydantic, pydantic-settings, httpx2, opentelemetry-api and theirs: 3.5 MB) is
not, so its wheels travel along (`bench/device_wheels.py` finds and downloads them):

    .venv/bin/python -m bench.device_wheels build/device-wheels     # here, once
    # on the device (the run tool: carry ["build/device-wheels"], timeout_s 600); it stops
    # starting tries after --budget-s (450 s) and prints each part's time as it goes:
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
        build/device-wheels/*.whl && PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
        python3 -m bench.trainer_gpu_scale --out $OUT

It writes $OUT/trainer_scale_gpu.md (copy it to bench/results/) and prints progress. On a CPU,
`python -m bench.trainer_gpu_scale --smoke` runs the same code on tiny shapes in seconds
(tests/unit/test_bench_trainer_gpu_scale.py runs it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers.utils import logging as hf_logging

from bench._forked import OK, Outcome, forked
from bench._qwen import QWEN25, build_qwen, parameters, qwen2_shape
from bench.trainer_cuda import ADAM, Timing, hand_written, loom_steps, rl_data
from services.trainer.distributed.commands import RankConfig
from services.trainer.distributed.rank import join
from services.trainer.distributed.sharding import Sharded, Sharding
from services.trainer.registry import ModelRegistry
from services.trainer.schemas import CreateModelRequest, Datum, LoraConfig, TrainingMode

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "trainer_scale_gpu.md"
FILE = "trainer_scale_gpu.md"
GIB = 1 << 30
# LOOM_TRAINER_PRECISION=bf16, LOOM_TRAINER_ACTIVATION_CHECKPOINTING=true.
POLICY = Sharding(precision="bf16", activation_checkpointing=True)
# Tiny Qwen2-shaped models for --smoke (head_dim 32; untied in the second, as 7B and up are).
SMOKE = {
    "smoke-s": qwen2_shape(64, 128, 2, 2, 1, 256, True),
    "smoke-m": qwen2_shape(96, 192, 3, 3, 1, 256, False),
}
SMOKE_ARGS = {
    "device": "cpu",
    "full": "smoke-s",
    "lora_sizes": ",".join(SMOKE),
    "rows": 2,
    "tokens": 16,
    "lora_rows": 2,
    "steps": 1,
    "lora_steps": 1,
    "lora_rank": 4,
}


@dataclass(frozen=True)
class Plan:
    device: str
    threads: int  # torch threads in each child; 0: torch's default
    full: str  # the shape fine-tuned in full
    full_shape: dict[str, Any]
    sizes: dict[str, dict[str, Any]]  # the LoRA ladder, ascending
    rows: int
    tokens: int
    lora_rows: int
    steps: int
    lora_steps: int
    lora_rank: int
    deadline: float  # time.monotonic() after which no try starts


# --- in the children ----------------------------------------------------------------------------


def probe(device: str) -> dict[str, Any]:
    """What the run is on: the GPU's name and memory (in a child: the parent never touches it)."""
    if torch.device(device).type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {
            "name": props.name,
            "memory": props.total_memory,
            "software": f"torch {torch.__version__}, CUDA {torch.version.cuda}",
        }
    return {"name": "CPU", "memory": None, "software": f"torch {torch.__version__}"}


def build(shape: dict[str, Any], directory: Path, device: str) -> int:
    """Saved in bf16, as published checkpoints are: half the disk and the time of fp32; the
    trainer and the hand-written step read it into fp32 weights either way."""
    return build_qwen(shape, directory, device, torch.bfloat16)


def loom(
    base: Path, work: Path, plan: Plan, mode: TrainingMode, data: list[Datum], steps: int
) -> Timing:
    """Loom's step on a rank of a one-rank group, as the service's ranks make their models
    (`services.trainer.distributed.rank.main`); the micro-batch budget is the device's
    default, as the service's."""
    config = RankConfig(
        world_size=1,
        master_port=0,
        data_dir=work,
        device=plan.device,
        micro_batch_tokens=None,
        threads=plan.threads,
        sharding=POLICY,
        timeout_s=600,
    )
    device = join(0, config)
    try:
        registry = ModelRegistry(
            config.data_dir, device, config.micro_batch_tokens, parallel=Sharded(config.sharding)
        )
        spec = CreateModelRequest(
            job_id="bench", base_model=str(base), mode=mode, lora=LoraConfig(rank=plan.lora_rank)
        )
        return loom_steps(registry.create(spec)[0], data, steps, device)
    finally:
        dist.destroy_process_group()


# --- the parent ---------------------------------------------------------------------------------


def remaining(plan: Plan) -> float:
    return plan.deadline - time.monotonic()


def full_part(plan: Plan, work: Path) -> dict[str, Any]:
    shape = plan.full_shape
    data = rl_data(plan.rows, shape["vocab_size"], 7, lambda rng: plan.tokens)
    base = work / "full"
    part: dict[str, Any] = {"params": parameters(shape)}
    built = _child(plan, build, shape, base, plan.device)
    if built[0] != OK:
        return {**part, "failed": f"model not built: {built[0]}, {built[1]}"}
    # The same policy by hand: fp32 weights, bf16 autocast, gradient checkpointing.
    by_hand = (base, plan.device, data, plan.steps, "bf16", None, True)
    part["hand-written"] = _child(plan, hand_written, *by_hand)
    print(f"full, hand-written: {_summary(part['hand-written'])}", flush=True)
    part["Loom"] = _child(plan, loom, base, work, plan, TrainingMode.full, data, plan.steps)
    print(f"full, Loom: {_summary(part['Loom'])}", flush=True)
    shutil.rmtree(base)
    return part


def _child(plan: Plan, function: Callable[..., Any], *args: Any) -> Outcome:
    return forked(function, *args, timeout_s=remaining(plan), threads=plan.threads)


def lora_ladder(plan: Plan, work: Path, device: dict[str, Any]) -> list[dict[str, Any]]:
    """Each shape in turn until one does not fit (or cannot be tried)."""
    rows: list[dict[str, Any]] = []
    for name, shape in plan.sizes.items():
        data = rl_data(plan.lora_rows, shape["vocab_size"], 11, lambda rng: plan.tokens)
        row: dict[str, Any] = {"name": name, "params": parameters(shape)}
        rows.append(row)
        reason = _cannot_try(row["params"], device, work, plan)
        if reason is not None:
            row["outcome"] = ("not tried", reason)
            break
        base, began = work / name, time.monotonic()
        built = _child(plan, build, shape, base, plan.device)
        row["outcome"] = (
            _child(plan, loom, base, work, plan, TrainingMode.lora, data, plan.lora_steps)
            if built[0] == OK
            else (built[0], f"while building the model: {built[1]}")
        )
        row["wall_s"] = time.monotonic() - began  # for sizing later runs' budgets
        shutil.rmtree(base, ignore_errors=True)
        print(f"LoRA {name}: {_summary(row['outcome'])}, {row['wall_s']:.0f} s", flush=True)
        if row["outcome"][0] != OK:
            break
    return rows


def _cannot_try(params: int, device: dict[str, Any], work: Path, plan: Plan) -> str | None:
    """Why a shape is not tried, where arithmetic already says it cannot fit (or no time is
    left): the rank holds the base in fp32 on the GPU and reads it whole into host memory
    first; its files are bf16."""
    fp32, files, gpu = 4 * params, 2 * params, device["memory"]
    available, free_disk = _available_memory(), shutil.disk_usage(work).free
    if gpu is not None and fp32 >= gpu:
        return f"its fp32 base alone is {fp32 / GIB:.0f} GiB, the GPU has {gpu / GIB:.0f}"
    if fp32 >= available:
        return f"its fp32 base is {fp32 / GIB:.0f} GiB, the host has {available / GIB:.0f} free"
    if files >= free_disk:
        return f"its bf16 files are {files / GIB:.0f} GiB, the disk has {free_disk / GIB:.0f} free"
    if remaining(plan) <= 0:
        return "the time budget (--budget-s) was spent"
    return None


def _available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise KeyError("MemAvailable")


def _summary(outcome: Outcome) -> str:
    status, value = outcome
    if status != OK:
        return f"{status}: {value}"
    times, peak = value
    return f"median {statistics.median(times):.3f} s, peak {peak / GIB:.1f} GiB"


# --- the report ---------------------------------------------------------------------------------


def _speed(outcome: Outcome, tokens: int) -> tuple[str, float | None]:
    """'median s | min s | tokens/s | peak GiB' cells, and tokens/s."""
    status, value = outcome
    if status != OK:
        return f"{status}: {value} | | |", None
    times, peak = value
    median = statistics.median(times)
    return (
        f"{median:.3f} | {min(times):.3f} | {tokens / median:,.0f} | "
        + (f"{peak / GIB:.1f}" if peak else "—"),
        tokens / median,
    )


def report(
    plan: Plan, device: dict[str, Any], full: dict[str, Any], ladder: list[Any], argv: list[str]
) -> str:
    memory = f", {device['memory'] / GIB:.0f} GiB" if device["memory"] else ""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        "# The trainer on one GPU: bf16 full fine-tuning and the largest LoRA "
        "(bench/trainer_gpu_scale.py)",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {device['name']}{memory}; "
        f"{device['software']}; host load average {load}. "
        f"`python -m bench.trainer_gpu_scale {' '.join(argv)}`.",
        "",
        "Loom: the sharded trainer's rank path at world size 1 (FSDP2, "
        "`LOOM_TRAINER_PRECISION=bf16`: bf16 compute, fp32 master weights, gradient reductions "
        "and AdamW moments; activation checkpointing on; the device's default micro-batch "
        f"budget). Importance-sampling loss, AdamW lr {ADAM.lr:g}, gradient clip "
        f"{ADAM.grad_clip:g}, rows of equal length (one pass, no padding); random-init weights "
        "(nothing downloaded). The service runs this path (a one-rank group) whenever "
        "`LOOM_TRAINER_PRECISION=bf16` or activation checkpointing is set.",
        "",
        f"## Full fine-tuning, {plan.full} shape ({full['params'] / 1e6:,.0f}M parameters)",
        "",
    ]
    return "\n".join(lines + _full_table(plan, full) + _lora_table(plan, ladder))


def _full_table(plan: Plan, full: dict[str, Any]) -> list[str]:
    if "failed" in full:
        return [full["failed"], ""]
    tokens = plan.rows * plan.tokens
    lines = [
        f"{plan.rows} rows x {plan.tokens} tokens ({tokens} a step); median of "
        f"{plan.steps} steps after one warm-up; each arm in its own process. Peak: "
        "torch.cuda.max_memory_allocated over the steps (the model loaded before).",
        "",
        "| step | median s | min s | tokens/s | peak GiB | tokens/s vs hand-written |",
        "|---|---|---|---|---|---|",
    ]
    arms = {arm: _speed(full[arm], tokens) for arm in ("hand-written", "Loom")}
    baseline = arms["hand-written"][1]
    for arm, label in (
        (
            "hand-written",
            "hand-written torch (fp32 weights, bf16 autocast, gradient checkpointing, AdamW)",
        ),
        ("Loom", "Loom (rank path, bf16 policy, activation checkpointing)"),
    ):
        cells, speed = arms[arm]
        ratio = f"{speed / baseline:.2f}x" if speed and baseline else "—"
        lines.append(f"| {label} | {cells} | {ratio} |")
    return [*lines, ""]


def _lora_table(plan: Plan, ladder: list[dict[str, Any]]) -> list[str]:
    tokens = plan.lora_rows * plan.tokens
    lines = [
        f"## LoRA (rank {plan.lora_rank}, Loom's default target modules): the largest shape "
        "that trains",
        "",
        f"{plan.lora_rows} rows x {plan.tokens} tokens ({tokens} a step), median of "
        f"{plan.lora_steps} steps after one warm-up; the base is frozen and held in fp32 (4 "
        "bytes a parameter), as the trainer holds it; shapes in ascending order, each in its "
        "own process, until one does not fit.",
        "",
        "| shape | parameters | fp32 base GiB | median s | min s | tokens/s | peak GiB "
        "| wall s (build, load, steps) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    trained = None
    for row in ladder:
        cells, speed = _speed(row["outcome"], tokens)
        trained = row["name"] if speed is not None else trained
        wall = f"{row['wall_s']:.0f}" if "wall_s" in row else ""
        lines.append(
            f"| {row['name']} | {row['params'] / 1e9:.2f}B | {4 * row['params'] / GIB:.1f} "
            f"| {cells} | {wall} |"
        )
    return [*lines, "", f"Largest shape whose LoRA training ran: {trained or 'none'}.", ""]


def plan_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Plan:
    shapes = SMOKE if args.smoke else QWEN25
    if args.smoke:
        vars(args).update(SMOKE_ARGS)
    sizes = args.lora_sizes.split(",")
    unknown = [name for name in (args.full, *sizes) if name not in shapes]
    if unknown:
        parser.error(f"no shape {unknown}; the shapes: {', '.join(shapes)}")
    return Plan(
        device=args.device,
        threads=1 if args.smoke else 0,
        full=args.full,
        full_shape=shapes[args.full],
        sizes={name: shapes[name] for name in sizes},
        rows=args.rows,
        tokens=args.tokens,
        lora_rows=args.lora_rows,
        steps=args.steps,
        lora_steps=args.lora_steps,
        lora_rank=args.lora_rank,
        deadline=time.monotonic() + args.budget_s,
    )


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--smoke", action="store_true", help=f"tiny shapes on the CPU, quickly: {SMOKE_ARGS}"
    )
    parser.add_argument("--out", type=Path, help=f"where to write {FILE}")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--full", default="1.5B", help="the shape fine-tuned in full")
    parser.add_argument("--lora-sizes", default=",".join(QWEN25), help="ascending")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--lora-rows", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lora-steps", type=int, default=3)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--budget-s", type=float, default=450, help="no try starts after it")
    parser.add_argument(
        "--work", type=Path, help="scratch directory (default: build/ here; --smoke: the system's)"
    )
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    plan = plan_of(args, parser)
    hf_logging.disable_progress_bar()  # the children's loads and saves: noise in the log
    # The models' files go to a disk: on the device /tmp may hold them in RAM (tmpfs), which
    # the trainer needs for reading the base whole.
    scratch_in = args.work or (None if args.smoke else REPO / "build")
    if scratch_in is not None:
        scratch_in.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch_in) as scratch:
        work = Path(scratch)
        status, device = forked(probe, plan.device, timeout_s=120)
        if status != OK:
            raise SystemExit(f"Cannot read the device {plan.device!r}: {device}")
        print(f"device: {device['name']}", flush=True)
        full = full_part(plan, work)
        ladder = lora_ladder(plan, work, device)
    text = report(plan, device, full, ladder, argv)
    # Elsewhere than on a GPU (a smoke run), only where it is told: the results are a GPU's.
    out = args.out or (RESULTS.parent if plan.device.startswith("cuda") else None)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / FILE).write_text(text)
    print(text, flush=True)
    return text


if __name__ == "__main__":
    main()
