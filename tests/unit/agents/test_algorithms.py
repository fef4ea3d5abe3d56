import math

import pytest

from agents.algorithms import group_advantages, has_signal, rl_datum, sft_datum
from services.rollout.schemas import Sample


def test_grpo_advantages_match_hand_computation() -> None:
    # rewards 1, 0, 0, 1: mean 0.5, population std 0.5 → ±1
    adv = group_advantages([1.0, 0.0, 0.0, 1.0], eps=0.0)
    assert adv == [1.0, -1.0, -1.0, 1.0]


def test_dr_grpo_only_centres() -> None:
    assert group_advantages([3.0, 1.0], normalize_std=False) == [1.0, -1.0]


def test_grpo_uneven_group() -> None:
    # rewards 1, 0, 0: mean 1/3, std sqrt(2/9)
    adv = group_advantages([1.0, 0.0, 0.0], eps=0.0)
    std = math.sqrt(2 / 9)
    assert adv == pytest.approx([(2 / 3) / std, (-1 / 3) / std, (-1 / 3) / std])
    assert sum(adv) == pytest.approx(0.0)


def test_zero_variance_group_has_no_signal() -> None:
    assert not has_signal([1.0, 1.0, 1.0])
    assert not has_signal([])
    assert has_signal([0.0, 1.0])
    assert group_advantages([1.0, 1.0]) == [0.0, 0.0]


def test_sft_datum_masks_prompt() -> None:
    datum = sft_datum([5, 6], [7, 8, 0])
    assert datum.input_ids == [5, 6, 7, 8, 0]
    assert datum.loss_mask == [0.0, 0.0, 1.0, 1.0, 1.0]


def test_rl_datum_aligns_logprobs_and_advantages() -> None:
    sample = Sample(token_ids=[9, 0], logprobs=[-0.5, -1.5], text="9", stop_reason="stop",
                    version=3)
    datum = rl_datum([1, 2, 3], sample, advantage=0.7)
    assert datum.input_ids == [1, 2, 3, 9, 0]
    assert datum.loss_mask == [0, 0, 0, 1, 1]
    assert datum.advantages == [0, 0, 0, 0.7, 0.7]
    assert datum.logprobs == [0, 0, 0, -0.5, -1.5]
