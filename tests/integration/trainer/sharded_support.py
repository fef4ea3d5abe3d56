"""What the sharded-trainer tests share (a helper module, not a test): the data, the models
made in pairs (on ranks, in one process) and the step-for-step comparison."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from services.trainer.distributed.remote import RemoteModel, RemoteRegistry
from services.trainer.model import TrainerModel
from services.trainer.registry import ModelRegistry
from services.trainer.schemas import (
    AdamParams,
    CreateModelRequest,
    Datum,
    LossAggregation,
    LossConfig,
    LossName,
    TrainingMode,
)
from tests.support.trainer_data import long_tailed_data

MICRO_BATCH_TOKENS = 48  # several micro-batches, one of them a single row (a stand-in on rank 1)
ADAM = AdamParams(lr=1e-4, grad_clip=1.0)  # see the README: Adam and rounding
STEPS = 3


def uneven_data(count: int = 7, seed: int = 0) -> list[Datum]:
    """Prompts of 4 tokens, completions of 1 to 30, sampler logprobs and advantages."""
    return long_tailed_data(count, seed, completions=(1, 3, 5, 9, 17, 30))


def pair(
    ranks: RemoteRegistry,
    one_process: ModelRegistry,
    job_id: str,
    base: Path,
    mode: TrainingMode = TrainingMode.full,
) -> tuple[RemoteModel, TrainerModel]:
    spec = CreateModelRequest(job_id=job_id, base_model=str(base), mode=mode)
    return ranks.create(spec)[0], one_process.create(spec)[0]


def weights(model: RemoteModel | TrainerModel, directory: Path) -> dict[str, torch.Tensor]:
    directory.mkdir()
    model.save(directory, shard_bytes=1 << 20)  # several files: both ranks write some
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


CONFIGS = [
    LossConfig(name=LossName.ppo, aggregation=LossAggregation.token_mean, kl_coef=0.1),
    LossConfig(name=LossName.ppo, aggregation=LossAggregation.sequence_mean, kl_coef=0.1),
    LossConfig(
        name=LossName.ppo, aggregation=LossAggregation.sum_normalized, normalizer=8, kl_coef=0.1
    ),
    LossConfig(name=LossName.ppo, aggregation=LossAggregation.sum, kl_coef=0.1),
]


def one_step(model: RemoteModel | TrainerModel, data: list[Datum]) -> tuple[float, float]:
    loss = model.forward_backward(data, CONFIGS[0]).loss
    return loss, model.optim_step(ADAM).grad_norm


def train_alongside(sharded: RemoteModel, single: TrainerModel, config: LossConfig) -> None:
    """STEPS steps of `config` on uneven data in both: the same losses, metrics, logprobs,
    gradient norms and final loss (fp32, within 1e-5)."""
    data = uneven_data()
    for step in range(1, STEPS + 1):
        want = single.forward_backward(data, config, return_logprobs=True)
        got = sharded.forward_backward(data, config, return_logprobs=True)
        assert got.loss == pytest.approx(want.loss, rel=1e-5, abs=1e-6)
        assert got.num_tokens == want.num_tokens
        assert got.metrics == pytest.approx(want.metrics, rel=1e-5, abs=1e-6)
        assert got.logprobs is not None and want.logprobs is not None
        for row, expected in zip(got.logprobs, want.logprobs, strict=True):
            assert row == pytest.approx(expected, abs=1e-5)
        stepped, expected_step = sharded.optim_step(ADAM), single.optim_step(ADAM)
        assert stepped.step == expected_step.step == step == sharded.info().step
        assert stepped.grad_norm == pytest.approx(expected_step.grad_norm, rel=1e-5)

    after = sharded.forward(data, config)
    assert after.loss == pytest.approx(single.forward(data, config).loss, rel=1e-5, abs=1e-6)
