"""The trainer on a GPU (CI has none: run it where one is). Three parts, one run:

1. Same results: the tiny model trained three steps on the CPU and on the GPU from the same
   weights and data (PPO with a KL term, micro-batched, full and LoRA): the largest
   differences of logprobs, losses, gradient norms and final weights, in full fp32 and with
   TF32 products (the trainer's CUDA default); a checkpoint taken on the GPU resumes on the
   CPU; save_weights writes from the GPU.
2. Speed: a random-init Qwen2.5-0.5B-shaped model, one optimizer step on rows of equal length
   (so padding favours no arm). Loom's `TrainerModel` (forward_backward + optim_step) against
   a hand-written torch step on the same model and data in the same run (the baseline; the
   ratio is Loom's overhead), in fp32, TF32 and (hand-written only) bf16 autocast.
3. Micro-batch budgets on a long-tailed batch: the CPU default, the CUDA default, one pass.

Writes bench/results/trainer_cuda.md.

    python -m bench.trainer_cuda [--rows 16] [--tokens 512] [--steps 10]
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import peft
import torch
from transformers import Qwen2ForCausalLM

from bench._qwen import QWEN25, build_qwen
from services.common.base_models import ensure_tiny_model
from services.trainer.batch import micro_batches, token_logprobs
from services.trainer.checkpoints import load_state, save_state
from services.trainer.lora_host import peft_config
from services.trainer.losses import compute_loss
from services.trainer.model import TrainerModel
from services.trainer.registry import ModelRegistry
from services.trainer.schemas import (
    AdamParams,
    CreateModelRequest,
    Datum,
    LoraConfig,
    LossConfig,
    LossName,
    TrainingMode,
)
from services.trainer.settings import DEFAULT_MICRO_BATCH_TOKENS

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "trainer_cuda.md"
PPO_KL = LossConfig(name=LossName.ppo, kl_coef=0.1)
IS_LOSS = LossConfig(name=LossName.importance_sampling)
ADAM = AdamParams(lr=1e-3)
ONE_PASS = 1 << 30
HALF_B = QWEN25["0.5B"]
VOCAB = HALF_B["vocab_size"]
# fp32 on both sides; the GPU sums in another order. Adam divides each gradient by its own
# running scale, so a parameter whose gradient is near zero can move by a good part of lr
# (1e-3) on one device and less on the other: weights are held to a tenth of a step.
TOLERANCE = {"logprob": 1e-4, "loss": 1e-4, "grad norm (relative)": 1e-4, "weight": 1e-4}
Timing = tuple[list[float], int]  # step times, peak GPU bytes


def rl_data(
    rows: int, vocab: int, seed: int, lengths: Callable[[random.Random], int]
) -> list[Datum]:
    rng = random.Random(seed)
    data = []
    for _ in range(rows):
        n = lengths(rng)
        prompt = n // 4
        mask = [0.0] * prompt + [1.0] * (n - prompt)
        advantage = rng.uniform(-1, 1)
        data.append(
            Datum(
                input_ids=[rng.randrange(3, vocab) for _ in range(n)],
                loss_mask=mask,
                logprobs=[-5.0 * m for m in mask],
                advantages=[advantage * m for m in mask],
            )
        )
    return data


@contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """TF32 matrix products, as the trainer service sets them on CUDA (`LOOM_TRAINER_TF32`)."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def trainer(
    work: Path, base: Path, device: str, mode: TrainingMode, budget: int, rank: int = 8
) -> TrainerModel:
    registry = ModelRegistry(work / f"{device}-{mode}-{budget}", torch.device(device), budget)
    spec = CreateModelRequest(
        job_id="bench", base_model=str(base), mode=mode, lora=LoraConfig(rank=rank), seed=3
    )
    return registry.create(spec)[0]


# --- 1. same results ---------------------------------------------------------------------------


def max_difference(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def compare_devices(
    work: Path, tiny: Path, mode: TrainingMode, device: str, tag: str
) -> dict[str, float]:
    """Largest CPU-GPU differences over three steps; the GPU model starts from the CPU one's
    trainable weights (LoRA inits from a seed draw from each device's own generator)."""
    cpu = trainer(work / tag, tiny, "cpu", mode, 64)
    gpu = trainer(work / tag, tiny, device, mode, 64)
    gpu.restore({n: p.detach().to(device) for n, p in cpu.named_trainable()}, None, 0, None)
    worst = dict.fromkeys(TOLERANCE, 0.0)
    for step in range(3):
        data = rl_data(12, cpu.vocab_size, step, lambda rng: rng.choice([6, 9, 14, 30, 61]))
        a = cpu.forward_backward(data, PPO_KL, return_logprobs=True)
        b = gpu.forward_backward(data, PPO_KL, return_logprobs=True)
        assert a.logprobs is not None and b.logprobs is not None
        norm_a, norm_b = cpu.optim_step(ADAM).grad_norm, gpu.optim_step(ADAM).grad_norm
        for key, value in (
            ("logprob", max_difference(a.logprobs, b.logprobs)),
            ("loss", abs(a.loss - b.loss)),
            ("grad norm (relative)", abs(norm_a - norm_b) / norm_a),
        ):
            worst[key] = max(worst[key], value)
    worst["weight"] = max(
        (pa.detach() - pb.detach().cpu()).abs().max().item()
        for (_, pa), (_, pb) in zip(cpu.named_trainable(), gpu.named_trainable(), strict=True)
    )
    # A checkpoint taken on the GPU resumes on the CPU (a cluster run continued on a laptop),
    # with the optimizer's moments; and a save_weights directory is written from the GPU.
    save_state(gpu, work / tag / "checkpoints", "from-gpu")
    load_state(cpu, work / tag / "checkpoints", "from-gpu")
    assert all(
        torch.equal(pa, pb.cpu())
        for (_, pa), (_, pb) in zip(cpu.named_trainable(), gpu.named_trainable(), strict=True)
    )
    assert cpu.optimizer_state() is not None and cpu.step == gpu.step
    (work / tag / "save").mkdir()
    gpu.save(work / tag / "save", shard_bytes=1 << 20)
    return worst


# --- 2. speed -----------------------------------------------------------------------------------


def measure(step: Callable[[], None], steps: int, device: str | torch.device = "cuda") -> Timing:
    """Step times after one warm-up (kernels chosen, optimizer state allocated), and the
    arm's peak GPU memory (0 on a CPU, where a smoke run uses this)."""
    cuda = torch.device(device).type == "cuda"
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    step()
    times = []
    for _ in range(steps):
        if cuda:
            torch.cuda.synchronize()
        began = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    return times, torch.cuda.max_memory_allocated() if cuda else 0


def hand_written(
    base: Path,
    device: str,
    data: list[Datum],
    steps: int,
    precision: str,
    lora: LoraConfig | None,
    checkpointing: bool = False,
) -> Timing:
    """The step a researcher writes by hand: one padded pass, the same loss, AdamW (LoRA:
    peft on the same base, Loom's default target modules); fp32 weights, bf16 autocast for
    `precision` bf16, and with `checkpointing` each layer's activations recomputed in the
    backward (transformers' gradient checkpointing)."""
    network = Qwen2ForCausalLM.from_pretrained(base, dtype=torch.float32).to(device)
    if checkpointing:
        network.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    if lora is not None:
        network = peft.get_peft_model(network, peft_config(lora))
    network.train()
    params = [p for p in network.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=ADAM.lr, betas=(ADAM.beta1, ADAM.beta2))
    ids, mask, old, advantages = (
        torch.tensor([getattr(d, field) for d in data], device=device)
        for field in ("input_ids", "loss_mask", "logprobs", "advantages")
    )

    def step() -> None:
        with torch.autocast(
            torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16"
        ):
            logits = network(
                input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False
            ).logits
        loss, _ = compute_loss(
            IS_LOSS, token_logprobs(logits, ids), mask, old_logprobs=old, advantages=advantages
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    with tf32(precision == "tf32"):
        return measure(step, steps, device)


def loom(
    work: Path,
    base: Path,
    device: str,
    data: list[Datum],
    steps: int,
    precision: str,
    lora: LoraConfig | None,
    budget: int,
) -> Timing:
    mode = TrainingMode.full if lora is None else TrainingMode.lora
    model = trainer(work, base, device, mode, budget, rank=lora.rank if lora else 8)
    with tf32(precision == "tf32"):
        return loom_steps(model, data, steps, device)


def loom_steps(
    model: TrainerModel, data: list[Datum], steps: int, device: str | torch.device
) -> Timing:
    """Loom's step (forward_backward, then optim_step), timed by `measure`."""

    def step() -> None:
        model.forward_backward(data, IS_LOSS)
        model.optim_step(ADAM)

    return measure(step, steps, device)


# --- report -------------------------------------------------------------------------------------


def same_results(work: Path, device: str) -> list[str]:
    lines = [
        "## Same results on CPU and GPU",
        "",
        "Tiny model, three steps of PPO with KL 0.1 on 12 rows of 6 to 61 tokens (micro-batch "
        "budget 64, so several passes a step), AdamW lr 1e-3; the GPU model starts from the "
        "CPU one's weights. Largest differences over the three steps:",
        "",
        "| mode | GPU products | " + " | ".join(TOLERANCE) + " | within tolerance |",
        "|---|---|" + "---|" * (len(TOLERANCE) + 1),
    ]
    tiny = ensure_tiny_model(work / "tiny")
    for mode in (TrainingMode.full, TrainingMode.lora):
        for products in ("fp32", "tf32"):
            with tf32(products == "tf32"):
                worst = compare_devices(work, tiny, mode, device, f"{mode}-{products}")
            ok = all(worst[k] <= TOLERANCE[k] for k in TOLERANCE)
            verdict = ("yes" if ok else "NO") if products == "fp32" else "— (not fp32)"
            lines.append(
                f"| {mode} | {products} | "
                + " | ".join(f"{worst[k]:.1e}" for k in TOLERANCE)
                + f" | {verdict} |"
            )
            print(lines[-1], flush=True)
    return [
        *lines,
        "",
        "Tolerances (fp32): "
        + ", ".join(f"{k} {v:g}" for k, v in TOLERANCE.items())
        + ". In every row a checkpoint taken on the "
        "GPU (weights and AdamW moments) resumed on the CPU with identical weights, and "
        "save_weights wrote its directory from the GPU.",
        "",
    ]


def speed(work: Path, base: Path, device: str, args: argparse.Namespace) -> list[str]:
    data = rl_data(args.rows, VOCAB, 7, lambda rng: args.tokens)
    cpu_budget = DEFAULT_MICRO_BATCH_TOKENS["cpu"]
    rank64 = LoraConfig(rank=64)
    # mode, step, products, LoRA, budget
    arms: list[tuple[str, str, str, LoraConfig | None, int]] = [
        *(("full", "hand-written", p, None, 0) for p in ("fp32", "tf32", "bf16")),
        ("full", "Loom", "fp32", None, cpu_budget),
        ("full", "Loom", "fp32", None, ONE_PASS),
        ("full", "Loom", "tf32", None, ONE_PASS),
        *(("LoRA r64", "hand-written", p, rank64, 0) for p in ("fp32", "tf32")),
        ("LoRA r64", "Loom", "fp32", rank64, cpu_budget),
        ("LoRA r64", "Loom", "fp32", rank64, ONE_PASS),
        ("LoRA r64", "Loom", "tf32", rank64, ONE_PASS),
    ]
    results: dict[tuple[str, str, str, int], Timing] = {}
    for mode, who, precision, lora, budget in arms:
        results[mode, who, precision, budget] = (
            hand_written(base, device, data, args.steps, precision, lora)
            if who == "hand-written"
            else loom(work, base, device, data, args.steps, precision, lora, budget)
        )
        print(
            mode,
            who,
            precision,
            budget,
            statistics.median(results[mode, who, precision, budget][0]),
            flush=True,
        )
    tokens = args.rows * args.tokens
    lines = [
        "## Speed: one optimizer step",
        "",
        f"Importance-sampling loss on {args.rows} rows of {args.tokens} tokens ({tokens} tokens "
        f"a step), AdamW, gradient clip 1.0, fp32 weights and optimizer state; median of "
        f"{args.steps} steps after one warm-up. Budget: Loom's micro-batch budget in tokens "
        f"({cpu_budget} is the CPU default; the next table chooses the CUDA one). Ratios are "
        "step times (below 1 is faster).",
        "",
        "| mode | step | products | budget | median s | min s | tokens/s | peak GiB "
        "| × hand-written fp32 | × hand-written, same products |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (mode, who, precision, budget), (times, peak) in results.items():
        median = statistics.median(times)
        own = results.get((mode, "hand-written", precision, 0))
        same = f"{median / statistics.median(own[0]):.2f}" if own else "—"
        lines.append(
            f"| {mode} | {who} | {precision} | "
            f"{'one pass' if budget == ONE_PASS else budget or '—'} | {median:.3f} | "
            f"{min(times):.3f} | {tokens / median:,.0f} | {peak / 2**30:.1f} | "
            f"{median / statistics.median(results[mode, 'hand-written', 'fp32', 0][0]):.2f} | "
            f"{same} |"
        )
    return [*lines, ""]


def budgets(work: Path, base: Path, device: str, args: argparse.Namespace) -> list[str]:
    """The budget trades padding and per-pass cost against peak memory: each pass's logits
    and their gradient ([rows, tokens, vocab] fp32) exist one micro-batch at a time."""
    batches = {
        f"{args.rows} x {args.tokens}": rl_data(args.rows, VOCAB, 7, lambda rng: args.tokens),
        # Long-tailed, as RL samples are: most rows short, a few long.
        "32, long-tailed": rl_data(
            32, VOCAB, 11, lambda rng: min(2048, 32 + int(rng.expovariate(1 / 224)))
        ),
    }
    lines = [
        "## Micro-batch budgets",
        "",
        f"Full weights, TF32, the same loss and optimizer; median of {args.steps} steps. "
        "Batches: "
        + "; ".join(
            f"{name}: {len(data)} rows of {min(len(d.input_ids) for d in data)}"
            f" to {max(len(d.input_ids) for d in data)} tokens "
            f"({sum(len(d.input_ids) for d in data)} in all)"
            for name, data in batches.items()
        )
        + ".",
        "",
        "| batch | budget | passes | tokens computed (padding included) | median s | tokens/s "
        "| peak GiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, data in batches.items():
        lengths = [len(d.input_ids) for d in data]
        for budget in (1024, 2048, 4096, 8192, 16384, ONE_PASS):
            groups = micro_batches(lengths, budget)
            padded = sum(len(rows) * lengths[rows[0]] for rows in groups)
            row = f"| {name} | {'one pass' if budget == ONE_PASS else budget} | {len(groups)} | "
            try:
                times, peak = loom(work, base, device, data, args.steps, "tf32", None, budget)
            except torch.cuda.OutOfMemoryError:
                lines.append(row + f"{padded} | out of GPU memory | | |")
                continue
            median = statistics.median(times)
            lines.append(
                row + f"{padded} | {median:.3f} | {sum(lengths) / median:,.0f} | "
                f"{peak / 2**30:.1f} |"
            )
            print(lines[-1], flush=True)
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    lines = [
        "# The trainer on a GPU",
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {torch.cuda.get_device_name(args.device)} "
        f"({platform.node()}), torch {torch.__version__}, `python -m bench.trainer_cuda --rows "
        f"{args.rows} --tokens {args.tokens} --steps {args.steps}`.",
        "",
    ]
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        lines += same_results(work, args.device)
        base = work / "qwen"
        params = build_qwen(HALF_B, base, args.device)
        lines += [
            f"The model below: Qwen2.5-0.5B's shape with random weights "
            f"({params / 1e6:.0f}M parameters; nothing is downloaded).",
            "",
        ]
        lines += speed(work, base, args.device, args)
        lines += budgets(work, base, args.device, args)
    RESULTS.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
