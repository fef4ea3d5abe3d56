"""bench/vs_trl.py's TRL arm, one process: Hugging Face TRL's `GRPOTrainer` on the shared start
checkpoint, the settings of `GrpoSetup`, generation with transformers on CPU. Writes a JSON
record: seconds per step, the steps' wall, per-phase seconds, held-out accuracy before and
after (greedy, outside the timed steps).

    python -m bench._vs_trl_trl --start DIR --steps 30 --out record.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench._vs_trl_task import (
    Curve,
    GrpoSetup,
    arm_arguments,
    hf_greedy_accuracy,
    reward,
    splits,
)

STARTED = time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    arm_arguments(parser)
    args = parser.parse_args()
    setup = GrpoSetup(seed=args.seed, lr=args.lr)
    args.out.write_text(json.dumps(run(args.start, args.steps, setup, args.eval_every)))


def run(start: Path, steps: int, setup: GrpoSetup, every: int) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    phases: dict[str, list[float]] = defaultdict(list)
    clock: dict[str, float] = {}

    class Timed(GRPOTrainer):  # type: ignore[misc]
        """GRPOTrainer with its phases timed (each call's seconds into `phases`)."""

        def _generate(self, prompts: list[Any]) -> Any:
            began = time.perf_counter()
            try:
                return super()._generate(prompts)
            finally:
                phases["sample"].append(time.perf_counter() - began)

        def _calculate_rewards(self, *args: Any) -> Any:
            began = time.perf_counter()
            try:
                return super()._calculate_rewards(*args)
            finally:
                phases["score"].append(time.perf_counter() - began)

        def _prepare_inputs(self, batch: Any) -> Any:
            began = time.perf_counter()
            try:
                return super()._prepare_inputs(batch)
            finally:
                clock["prepare"] = time.perf_counter() - began

        def training_step(self, *args: Any, **kwargs: Any) -> Any:
            # The Trainer's training_step prepares the inputs (generation and scoring)
            # first: forward_backward is what remains.
            began = time.perf_counter()
            try:
                return super().training_step(*args, **kwargs)
            finally:
                phases["forward_backward"].append(
                    time.perf_counter() - began - clock.pop("prepare", 0.0)
                )

    class Steps(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, *_args: Any, **_kwargs: Any) -> None:
            clock["begin"] = clock["last"] = time.perf_counter()

        def on_pre_optimizer_step(self, *_args: Any, **_kwargs: Any) -> None:
            clock["optim"] = time.perf_counter()

        def on_optimizer_step(self, *_args: Any, **_kwargs: Any) -> None:
            phases["optim"].append(time.perf_counter() - clock.pop("optim"))

        def on_step_end(self, _args: Any, state: Any, *_rest: Any, **_kwargs: Any) -> None:
            phases["step"].append(time.perf_counter() - clock["last"])
            curve.after_step(state.global_step)
            model.train()  # the evaluation left it in eval mode
            clock["last"] = time.perf_counter()  # the next step starts after the evaluation

    def arith_reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [reward(c, a) for c, a in zip(completions, answer, strict=True)]

    train, _, held_out = splits()
    tokenizer = AutoTokenizer.from_pretrained(start)
    model = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32)
    curve = Curve(
        every, steps, lambda _: hf_greedy_accuracy(model, tokenizer, held_out, setup.max_tokens)
    )
    curve.evaluate(0)
    dataset = Dataset.from_list([{"prompt": p.prompt, "answer": p.answer} for p in train])
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as output_dir:
        config = GRPOConfig(
            output_dir=output_dir,
            max_steps=steps,
            seed=setup.seed,
            use_cpu=True,
            bf16=False,
            per_device_train_batch_size=setup.prompts * setup.group,
            gradient_accumulation_steps=1,
            num_generations=setup.group,
            max_completion_length=setup.max_tokens,
            temperature=setup.temperature,
            top_p=1.0,
            top_k=0,
            use_vllm=False,
            beta=0.0,
            loss_type="grpo",
            scale_rewards="group",
            epsilon=setup.clip,
            num_iterations=1,
            learning_rate=setup.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            adam_beta1=setup.beta1,
            adam_beta2=setup.beta2,
            weight_decay=setup.weight_decay,
            max_grad_norm=setup.grad_clip,
            gradient_checkpointing=False,
            report_to=[],
            logging_steps=1,
            save_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = Timed(
            model=model,
            reward_funcs=arith_reward,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[Steps()],
        )
        setup_s = time.perf_counter() - STARTED
        trainer.train()
        wall = clock["last"] - clock["begin"] - curve.seconds
        rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    return {
        "arm": "trl",
        "wall_s": wall,
        "step_s": phases.pop("step"),
        "phases": phases,
        "accuracy_before": curve.points[0][1],
        "accuracy_after": curve.points[-1][1],
        "curve": curve.points,
        "rewards": rewards,
        "setup_s": setup_s,
        "threads": torch.get_num_threads(),
    }


if __name__ == "__main__":
    main()
