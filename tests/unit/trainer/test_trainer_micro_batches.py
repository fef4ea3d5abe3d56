"""Micro-batches by length: how rows are grouped, and that the loss, logprobs and gradients are
the whole batch's whatever the grouping (the tiny model on CPU)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from services.common.errors import InvalidInput
from services.trainer.batch import micro_batches
from services.trainer.model import TrainerModel, micro_batch_budget
from services.trainer.registry import ModelRegistry
from services.trainer.schemas import (
    CreateModelRequest,
    LossAggregation,
    LossConfig,
    LossName,
    TrainingMode,
)
from tests.support.trainer_data import long_tailed_data


@given(
    st.lists(st.integers(min_value=2, max_value=300), min_size=1, max_size=64),
    st.integers(min_value=1, max_value=2000),
)
def test_micro_batches_cover_every_row_once_within_the_budget(
    lengths: list[int], budget: int
) -> None:
    groups = micro_batches(lengths, budget)
    assert sorted(i for rows in groups for i in rows) == list(range(len(lengths)))
    widths = [lengths[rows[0]] for rows in groups]
    assert widths == sorted(widths, reverse=True)  # longest first
    for rows in groups:
        assert [lengths[i] for i in rows] == sorted((lengths[i] for i in rows), reverse=True)
        assert len(rows) == 1 or len(rows) * lengths[rows[0]] <= budget


def test_micro_batches_keep_short_rows_apart_from_long_ones() -> None:
    lengths = [200, 10, 12, 190, 11, 9]
    assert micro_batches(lengths, 400) == [[0, 3], [2, 4, 1, 5]]
    assert micro_batches(lengths, 10_000) == [[0, 3, 2, 4, 1, 5]]


def model_with_budget(
    tiny_model_dir: Path, tmp_path: Path, mode: TrainingMode, micro_batch_tokens: int
) -> TrainerModel:
    registry = ModelRegistry(
        tmp_path / str(micro_batch_tokens), torch.device("cpu"), micro_batch_tokens
    )
    spec = CreateModelRequest(job_id="j1", base_model=str(tiny_model_dir), mode=mode, seed=3)
    model, _ = registry.create(spec)
    return model


CONFIGS = [
    LossConfig(name=LossName.ppo, aggregation=LossAggregation.token_mean, kl_coef=0.1),
    LossConfig(name=LossName.ppo, aggregation=LossAggregation.sequence_mean, kl_coef=0.1),
    LossConfig(name=LossName.cispo, aggregation=LossAggregation.sum_normalized, normalizer=8),
    LossConfig(name=LossName.importance_sampling, aggregation=LossAggregation.sum, tis_cap=2.0),
    LossConfig(name=LossName.cross_entropy),
]


@pytest.mark.slow  # 10 cases, two models each (the rest of this file splits batches too)
@pytest.mark.parametrize("mode", [TrainingMode.full, TrainingMode.lora])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.name.value}-{c.aggregation.value}")
def test_micro_batched_training_equals_one_pass(
    tiny_model_dir: Path, tmp_path: Path, mode: TrainingMode, config: LossConfig
) -> None:
    """Each micro-batch is back-propagated on its own (its share of the loss divided by the
    whole batch's totals): loss, metrics and gradients are those of one graph over the batch."""
    torch.manual_seed(0)
    data = long_tailed_data(12)
    one_pass = model_with_budget(tiny_model_dir, tmp_path, mode, 10_000)
    split = model_with_budget(tiny_model_dir, tmp_path, mode, 70)
    expected = one_pass.forward_backward(data, config, return_logprobs=True)
    got = split.forward_backward(data, config, return_logprobs=True)

    assert got.loss == pytest.approx(expected.loss, rel=1e-5, abs=1e-6)
    assert got.metrics == pytest.approx(expected.metrics, rel=1e-5, abs=1e-6)
    assert got.logprobs is not None and expected.logprobs is not None
    for row, want in zip(got.logprobs, expected.logprobs, strict=True):
        assert row == pytest.approx(want, abs=1e-5)
    for (name, a), (_, b) in zip(split.named_trainable(), one_pass.named_trainable(), strict=True):
        assert a.grad is not None and b.grad is not None, name
        # fp32 sums in another order: an element's error scales with the tensor's largest
        # gradient (up to ~18 with `sum` aggregation), not with its own value.
        atol = 1e-6 * max(1.0, b.grad.abs().max().item())
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=atol, msg=name)


@pytest.mark.parametrize("earlier_gradients", [False, True])
def test_a_failing_later_micro_batch_leaves_the_gradients_as_they_were(
    tiny_model_dir: Path, tmp_path: Path, earlier_gradients: bool
) -> None:
    """Earlier micro-batches have added their gradients when a later one's loss is not finite:
    the call fails as a whole and takes them back."""
    model = model_with_budget(tiny_model_dir, tmp_path, TrainingMode.full, 70)
    config = LossConfig(name=LossName.importance_sampling)
    data = long_tailed_data(12)
    if earlier_gradients:
        model.forward_backward(data, config)
    before = {
        name: None if p.grad is None else p.grad.clone() for name, p in model.named_trainable()
    }
    # The shortest rows run last (longest first); one of them has an infinite advantage.
    shortest = min(range(len(data)), key=lambda i: len(data[i].input_ids))
    bad = data[shortest]
    data[shortest] = bad.model_copy(update={"advantages": [a * math.inf for a in bad.advantages]})
    with pytest.raises(InvalidInput, match="no gradients were accumulated"):
        model.forward_backward(data, config)
    for name, param in model.named_trainable():
        if before[name] is None:
            assert param.grad is None, name
        else:
            assert param.grad is not None
            torch.testing.assert_close(param.grad, before[name], rtol=0, atol=0, msg=name)


def test_forward_without_gradients_is_split_too(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = long_tailed_data(9, seed=1)
    one_pass = model_with_budget(tiny_model_dir, tmp_path, TrainingMode.full, 10_000)
    split = model_with_budget(tiny_model_dir, tmp_path, TrainingMode.full, 1)
    expected, got = one_pass.forward(data), split.forward(data)
    assert [len(row) for row in got.logprobs] == [len(d.input_ids) for d in data]
    for row, want in zip(got.logprobs, expected.logprobs, strict=True):
        assert row == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize(
    ("device", "setting", "budget"),
    [
        ("cpu", None, 1024),
        ("cuda", None, 8192),
        ("cuda:1", None, 8192),
        ("cuda", 300, 300),
        ("cpu", 5000, 5000),
    ],
)
def test_budget_defaults_by_device_and_a_setting_wins(
    device: str, setting: int | None, budget: int
) -> None:
    assert micro_batch_budget(torch.device(device), setting) == budget


def test_the_loss_takes_logprobs_at_the_sampling_temperature(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = model_with_budget(tiny_model_dir, tmp_path, TrainingMode.full, 70)
    data = long_tailed_data(3, seed=2)
    got = model.forward(data, LossConfig(name=LossName.cross_entropy, temperature=0.5))
    with model.network() as network, torch.no_grad():
        for datum, row in zip(data, got.logprobs, strict=True):
            ids = torch.tensor([datum.input_ids])
            logits = network(input_ids=ids, use_cache=False).logits[0, :-1] / 0.5
            want = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
            assert row[1:] == pytest.approx(want.tolist(), abs=1e-4)
    plain = model.forward(data, LossConfig(name=LossName.cross_entropy))
    assert plain.logprobs[0][1:] != pytest.approx(got.logprobs[0][1:], abs=1e-3)
