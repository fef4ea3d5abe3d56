"""What both arms of bench/vs_trl.py share: the GRPO settings, the demo's arithmetic task and
its reward, greedy held-out accuracy with transformers, and the common starting checkpoint (the
tiny model after a short supervised warm-up, saved as a Hugging Face directory)."""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agents.datasets.arithmetic import Problem, make_splits
from agents.examples.arith_grpo import ArithConfig
from services.common.tiny_model import EOS, build_tiny_model
from services.reward.verifiers import FirstIntegerParams, score_first_integer


@dataclass(frozen=True)
class GrpoSetup:
    """The hyperparameters both arms train with (TRL's names in the comments)."""

    prompts: int = 16  # per_device_train_batch_size = prompts * group
    group: int = 8  # num_generations
    max_tokens: int = 8  # max_completion_length
    temperature: float = 1.0
    lr: float = 1e-3  # learning_rate, constant (lr_scheduler_type="constant")
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.01  # the demo's
    grad_clip: float = 1.0  # max_grad_norm
    clip: float = 0.2  # epsilon (= epsilon_high): symmetric, as Loom's grpo()
    seed: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def arm_arguments(parser: argparse.ArgumentParser) -> None:
    """What every arm's process is given: the start, the steps, its file, seed and rate."""
    parser.add_argument("--start", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=GrpoSetup.lr)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--eval-every", type=int, default=10, help="held-out accuracy every this many steps"
    )


@dataclass
class Curve:
    """Held-out accuracy before the first step, every `every` steps and after the last, each
    evaluation timed (`seconds`, after steps) so an arm leaves it out of its steps and wall.
    `measure` takes what the arm evaluates (Loom: a version number; TRL: nothing, its model
    as it is)."""

    every: int
    steps: int
    measure: Callable[[Any], float]
    points: list[tuple[int, float]] = field(default_factory=list)
    seconds: float = 0.0

    def evaluate(self, step: int, at: Any = None) -> None:
        self.points.append((step, self.measure(at)))

    def after_step(self, step: int, at: Any = None) -> float:
        """Evaluate when `step` is due; the seconds it took (0 when not due)."""
        if step % self.every and step != self.steps:
            return 0.0
        began = time.perf_counter()
        self.evaluate(step, at)
        spent = time.perf_counter() - began
        self.seconds += spent
        return spent


# The warm-up: the demo's SFT settings (ArithConfig's sft_* fields, weight decay, seed) and
# the beta2 its SFT steps use.
WARM_UP = ArithConfig()
WARM_UP_BETA2 = 0.95
WARM_UP_FIELDS = {
    "sft_lr",
    "sft_warmup_steps",
    "sft_decay_steps",
    "sft_final_lr_fraction",
    "sft_batch",
    "sft_min_steps",
    "sft_max_steps",
    "sft_check_every",
    "sft_target_accuracy",
    "weight_decay",
    "seed",
    "held_out",
    "validation",
}


def splits() -> tuple[list[Problem], list[Problem], list[Problem]]:
    """The demo's splits: train, validation, held-out."""
    train, validation, held_out = make_splits(
        held_out=WARM_UP.held_out, validation=WARM_UP.validation, seed=WARM_UP.seed
    )
    return train, validation, held_out


def reward(completion: str, answer: str) -> float:
    """1.0 when the completion's first integer is the sum (the reward service's
    `first_integer`, the `arithmetic` environment's default)."""
    return score_first_integer(completion, answer, FirstIntegerParams())[0]


def hf_greedy_accuracy(
    model: Any, tokenizer: Any, problems: list[Problem], max_tokens: int, batch: int = 200
) -> float:
    """Share of `problems` whose greedy completion earns the reward (transformers generate,
    prompts left-padded)."""
    import torch

    tokenizer.padding_side = "left"
    right = 0.0
    model.eval()
    for start in range(0, len(problems), batch):
        chunk = problems[start : start + batch]
        inputs = tokenizer(
            [p.prompt for p in chunk], return_tensors="pt", padding=True, add_special_tokens=False
        )
        with torch.no_grad():
            out = model.generate(
                **inputs,
                max_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
        texts = tokenizer.batch_decode(
            out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True
        )
        right += sum(reward(t, p.answer) for t, p in zip(texts, chunk, strict=True))
    return right / len(problems)


def warm_up_setup() -> dict[str, Any]:
    """What the start checkpoint depends on (its record: a change rebuilds it)."""
    return {"beta2": WARM_UP_BETA2, **WARM_UP.model_dump(include=WARM_UP_FIELDS)}


def build_start(out: Path, max_tokens: int = 8) -> Path:
    """The tiny model after the warm-up (steps of `sft_batch` train problems until greedy
    validation accuracy reaches `sft_target_accuracy`, checked every `sft_check_every` steps
    from `sft_min_steps` on), written to `out` once (kept between runs: same setup, same
    directory); `out/start.json` records the setup and the validation accuracy reached."""
    setup = WARM_UP
    record = out / "start.json"
    if record.exists() and json.loads(record.read_text()).get("setup") == warm_up_setup():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shutil.rmtree(out, ignore_errors=True)
    base = build_tiny_model(out.with_name(out.name + ".base"))
    torch.manual_seed(setup.seed)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    train, validation, _ = splits()
    rows = [_sft_row(tokenizer, p) for p in train]
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=setup.sft_lr,
        betas=(0.9, WARM_UP_BETA2),
        weight_decay=setup.weight_decay,
    )
    rng = random.Random(setup.seed)
    accuracy, step = 0.0, 0
    for step in range(1, setup.sft_max_steps + 1):
        model.train()
        ids, labels = _batch(rng.sample(rows, setup.sft_batch), tokenizer.pad_token_id)
        # Padding sits after each row's tokens: a causal model's rows never see it.
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = setup.sft_lr_at(step)
        optimizer.step()
        optimizer.zero_grad()
        if step >= setup.sft_min_steps and step % setup.sft_check_every == 0:
            accuracy = hf_greedy_accuracy(model, tokenizer, validation, max_tokens)
            if accuracy >= setup.sft_target_accuracy:
                break
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    shutil.copy(base / "generation_config.json", out / "generation_config.json")
    shutil.rmtree(base)
    record.write_text(
        json.dumps({"setup": warm_up_setup(), "steps": step, "validation_accuracy": accuracy})
    )
    return out


def _sft_row(tokenizer: Any, problem: Problem) -> tuple[list[int], list[int]]:
    prompt = tokenizer(problem.prompt, add_special_tokens=False)["input_ids"]
    answer = tokenizer(problem.answer + EOS, add_special_tokens=False)["input_ids"]
    return prompt + answer, [-100] * len(prompt) + answer


def _batch(rows: list[tuple[list[int], list[int]]], pad: int) -> tuple[Any, Any]:
    """Right-padded ids and labels (-100 where no loss: prompt and padding)."""
    import torch

    width = max(len(ids) for ids, _ in rows)
    ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in rows])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
    return ids, labels
