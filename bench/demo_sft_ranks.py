"""The arith demo's SFT (`loom demo`: `agents/examples/arith_grpo.py`) against the trainer's
models directly, at world size 1 (ModelRegistry in process, as the trainer runs one rank) or
2 (RemoteRegistry over a RankGroup of two FSDP2 rank processes, gloo, CPU): the same tiny
model, the demo's train split and tokens, 64 rows a step drawn by `random.Random(seed)`,
cross-entropy, AdamW (beta2 0.95), the demo's learning-rate warm-up and decay (`--schedule
constant`: the constant rate it had before), and the demo's save_weights every `--save-every` steps
from `--save-from` on (plus save_state with `--save-state`, as the managed recipe does).
Prints loss and grad norm every 10 steps and writes every step's to `--out` (JSON) for
comparing arms. Issue 35: does two-rank SFT learn as one-rank SFT does?

    .venv/bin/python -m bench.demo_sft_ranks --world 2 --steps 300 --out /tmp/ws2.json
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from agents.algorithms import sft_datum
from agents.datasets.arithmetic import make_splits
from agents.examples.arith_grpo import ArithConfig
from services.common.base_models import ensure_tiny_model
from services.common.tiny_model import EOS
from services.trainer import checkpoints
from services.trainer.distributed.commands import RankConfig
from services.trainer.distributed.ranks import RankGroup
from services.trainer.distributed.remote import RemoteModel, RemoteRegistry
from services.trainer.distributed.sharding import Sharding
from services.trainer.model import TrainerModel
from services.trainer.registry import ModelRegistry
from services.trainer.schemas import (
    AdamParams,
    CreateModelRequest,
    Datum,
    LossConfig,
    TrainingMode,
)

SHARD_BYTES = 1 << 20  # several weight files, so both ranks write some


def demo_splits(base: Path, config: ArithConfig) -> list[list[Datum]]:
    """The demo's train, validation and held-out splits as the demo encodes them (prompt,
    then answer + EOS)."""
    tokenizer = AutoTokenizer.from_pretrained(base)
    splits = make_splits(held_out=config.held_out, validation=config.validation, seed=config.seed)
    encoded = []
    for split in splits:
        prompts = tokenizer([p.prompt for p in split])["input_ids"]
        answers = tokenizer([p.answer + EOS for p in split])["input_ids"]
        encoded.append([sft_datum(p, a) for p, a in zip(prompts, answers, strict=True)])
    return encoded


@torch.no_grad()
def accuracy(base: Path, weights: Path, data: list[Datum]) -> float:
    """The demo's greedy exact-match accuracy, computed teacher-forced: a row counts when every
    answer token and the EOS after it is the argmax (then greedy decoding writes exactly the
    answer and stops), on the published weights loaded into a plain transformers model."""
    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    state: dict[str, torch.Tensor] = {}
    for path in weights.glob("*.safetensors"):
        state.update(load_file(path))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # tied
    width = max(len(d.input_ids) for d in data)
    ids = torch.tensor([d.input_ids + [0] * (width - len(d.input_ids)) for d in data])
    mask = torch.tensor([d.loss_mask + [0.0] * (width - len(d.loss_mask)) for d in data]) > 0
    predicted = model(ids).logits[:, :-1].argmax(-1)
    wrong = (predicted != ids[:, 1:]) & mask[:, 1:]
    return float((~wrong.any(-1)).float().mean())


def run(args: argparse.Namespace, model: TrainerModel | RemoteModel, work: Path) -> list[dict]:
    config = ArithConfig()
    constant = args.schedule == "constant"
    schedule = config.model_copy(  # the demo's rate at each step, or the constant one
        update={
            "sft_lr": args.lr,
            "sft_warmup_steps": 0 if constant else args.warmup,
            "sft_decay_steps": args.decay_steps,
            "sft_final_lr_fraction": 1.0 if constant else args.final_lr_factor,
        }
    )
    base = Path(model.spec.base_model)
    data, validation, held_out = demo_splits(base, config)
    adam = AdamParams(
        lr=args.lr,
        beta2=0.95,
        weight_decay=args.wd,
        grad_clip=None if args.no_clip else 1.0,
    )
    rng = random.Random(args.batch_seed)  # run_demo draws every step's batch from one generator
    steps = []
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        loss = model.forward_backward(rng.sample(data, config.sft_batch), LossConfig()).loss
        lr = schedule.sft_lr_at(step)
        grad_norm = model.optim_step(adam.model_copy(update={"lr": lr})).grad_norm
        steps.append({"step": step, "loss": loss, "grad_norm": grad_norm})
        if step >= args.save_from and step % args.save_every == 0:
            if args.save_state:
                checkpoints.save_state(model, work / "states", f"step-{step}")
            weights = work / f"weights-{step}"
            weights.mkdir()
            model.save(weights, SHARD_BYTES)
            scores = (accuracy(base, weights, validation), accuracy(base, weights, held_out))
            steps[-1] |= {"validation": scores[0], "held_out": scores[1]}
            print(f"step {step:4d} validation {scores[0]:.1%} held-out {scores[1]:.1%}")
        if step % 10 == 0:
            print(
                f"step {step:4d} loss {loss:.6f} grad_norm {grad_norm:9.4f} "
                f"({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--world", type=int, choices=(1, 2), default=1)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=ArithConfig().sft_lr)
    parser.add_argument("--wd", type=float, default=ArithConfig().weight_decay)
    parser.add_argument("--no-clip", action="store_true")
    parser.add_argument("--save-from", type=int, default=ArithConfig().sft_min_steps)
    parser.add_argument("--save-every", type=int, default=ArithConfig().sft_check_every)
    parser.add_argument("--save-state", action="store_true")
    parser.add_argument(
        "--batch-seed", type=int, default=ArithConfig().seed, help="another run of batches"
    )
    parser.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=None,
        help="the trainer's LOOM_TRAINER_MICRO_BATCH_TOKENS (default: its CPU default)",
    )
    demo = ArithConfig()
    parser.add_argument(
        "--schedule",
        choices=("constant", "cosine"),
        default="cosine",
        help="cosine: the demo's warm-up and decay (constant: the demo's before)",
    )
    parser.add_argument("--warmup", type=int, default=demo.sft_warmup_steps)
    parser.add_argument("--decay-steps", type=int, default=demo.sft_decay_steps)
    parser.add_argument("--final-lr-factor", type=float, default=demo.sft_final_lr_fraction)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the trainer's default (LOOM_TRAINER_THREADS=1)
    with tempfile.TemporaryDirectory(prefix="demo-sft-") as tmp:
        work = Path(tmp)
        base = ensure_tiny_model(work / "tiny")
        spec = CreateModelRequest(job_id="demo-sft", base_model=str(base), mode=TrainingMode.full)
        if args.world == 1:
            registry = ModelRegistry(work / "one", torch.device("cpu"), args.micro_batch_tokens)
            steps = run(args, registry.create(spec)[0], work)
        else:
            group = RankGroup(
                RankConfig(
                    world_size=args.world,
                    master_port=0,
                    data_dir=work / "ranks",
                    device="cpu",
                    micro_batch_tokens=args.micro_batch_tokens,
                    threads=1,
                    sharding=Sharding(),
                    timeout_s=300,
                )
            )
            group.start()
            try:
                steps = run(args, RemoteRegistry(group).create(spec)[0], work)
            finally:
                group.stop()
    args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "steps": steps}))


if __name__ == "__main__":
    main()
