"""An optimizer step with an exactly zero gradient (an RL batch whose advantages are all zero,
no KL) leaves the weights where they are: AdamW would otherwise move them through its momentum
and weight decay."""

from __future__ import annotations

from pathlib import Path

import torch

from services.trainer.registry import ModelRegistry
from services.trainer.schemas import (
    AdamParams,
    CreateModelRequest,
    Datum,
    LossConfig,
    LossName,
    TrainingMode,
)
from tests.support.trainer_data import long_tailed_data

ADAM = AdamParams(lr=1e-2, weight_decay=0.1)
PPO = LossConfig(name=LossName.ppo)


def _without_advantage(data: list[Datum]) -> list[Datum]:
    return [datum.model_copy(update={"advantages": [0.0] * len(datum.input_ids)}) for datum in data]


def test_a_zero_gradient_step_moves_nothing_and_a_real_one_still_does(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    registry = ModelRegistry(tmp_path, torch.device("cpu"))
    model, _ = registry.create(
        CreateModelRequest(
            job_id="j1", base_model=str(tiny_model_dir), mode=TrainingMode.full, seed=3
        )
    )
    data = long_tailed_data(6)
    model.forward_backward(data, PPO)
    first = model.optim_step(ADAM)  # Adam now has momentum, weight decay is on
    assert first.applied and first.grad_norm > 0
    before = {name: param.detach().clone() for name, param in model.named_trainable()}

    model.forward_backward(_without_advantage(data), PPO)
    idle = model.optim_step(ADAM)
    assert (idle.applied, idle.grad_norm, idle.step) == (False, 0.0, first.step + 1)
    for name, param in model.named_trainable():
        assert torch.equal(param.detach(), before[name]), name

    model.forward_backward(data, PPO)
    assert model.optim_step(ADAM).applied
    moved = [
        name
        for name, param in model.named_trainable()
        if not torch.equal(param.detach(), before[name])
    ]
    assert moved
