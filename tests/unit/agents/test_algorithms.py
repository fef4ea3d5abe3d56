import math

import pytest

from agents.algorithms import (
    dapo,
    dr_grpo,
    dr_grpo_advantages,
    group_advantages,
    grpo,
    has_signal,
    overlong_penalty,
    rl_datum,
    rloo,
    rloo_advantages,
    sft_datum,
    trajectory_datum,
)
from services.rollout.schemas import RolloutGroup, Sample, Trajectory, TurnInfo
from services.trainer.schemas import LossAggregation


def test_grpo_advantages_match_hand_computation() -> None:
    # rewards 1, 0, 0, 1: mean 0.5, sample std sqrt(1/3) (TRL, verl); population std 0.5
    adv = group_advantages([1.0, 0.0, 0.0, 1.0], eps=0.0)
    assert adv == pytest.approx(
        [
            0.5 / math.sqrt(1 / 3),
            -0.5 / math.sqrt(1 / 3),
            -0.5 / math.sqrt(1 / 3),
            0.5 / math.sqrt(1 / 3),
        ]
    )
    population = group_advantages([1.0, 0.0, 0.0, 1.0], eps=0.0, std="population")
    assert population == [1.0, -1.0, -1.0, 1.0]
    assert group_advantages([1.0], eps=0.0) == [0.0]  # one sample: no spread, no signal


def test_dr_grpo_only_centres() -> None:
    assert group_advantages([3.0, 1.0], normalize_std=False) == [1.0, -1.0]


def test_grpo_uneven_group() -> None:
    # rewards 1, 0, 0: mean 1/3, sample std sqrt((4/9 + 1/9 + 1/9) / 2) = sqrt(1/3)
    adv = group_advantages([1.0, 0.0, 0.0], eps=0.0)
    std = math.sqrt(1 / 3)
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
    sample = Sample(
        token_ids=[9, 0], logprobs=[-0.5, -1.5], text="9", stop_reason="stop", version=3
    )
    datum = rl_datum([1, 2, 3], sample, advantage=0.7)
    assert datum.input_ids == [1, 2, 3, 9, 0]
    assert datum.loss_mask == [0, 0, 0, 1, 1]
    assert datum.advantages == [0, 0, 0, 0.7, 0.7]
    assert datum.logprobs == [0, 0, 0, -0.5, -1.5]


def test_rloo_subtracts_the_mean_of_the_others() -> None:
    # rewards 1, 0, 0, 1: for the first, the others' mean is 1/3 → 2/3
    assert rloo_advantages([1.0, 0.0, 0.0, 1.0]) == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    # it equals G/(G-1) times the centred reward
    rewards = [0.3, 0.9, 0.0]
    assert rloo_advantages(rewards) == pytest.approx([1.5 * c for c in dr_grpo_advantages(rewards)])
    assert rloo_advantages([1.0]) == [0.0]


@pytest.mark.parametrize(
    ("tokens", "penalty"), [(10, 0.0), (12, 0.0), (14, -0.5), (16, -1.0), (17, -1.0)]
)
def test_overlong_penalty_is_a_linear_ramp(tokens: int, penalty: float) -> None:
    # max 16 tokens, buffer 4: no penalty up to 12, then down to -1 at 16
    assert overlong_penalty(tokens, max_tokens=16, buffer=4) == pytest.approx(penalty)


def trajectory(reward: float | None, model_tokens: int = 2) -> Trajectory:
    # prompt [1, 2]; one model turn, a tool turn of 2 tokens, then the rest of the model's
    token_ids = [10, 11, 20, 21, *range(30, 30 + model_tokens - 2)]
    mask = [1, 1, 0, 0, *[1] * (model_tokens - 2)]
    turns = [
        TurnInfo(kind="model", start=0, end=2, text=""),
        TurnInfo(kind="env", start=2, end=4, text=""),
    ]
    if model_tokens > 2:
        turns.append(TurnInfo(kind="model", start=4, end=len(token_ids), text=""))
    return Trajectory(
        task_index=0,
        sample_index=0,
        prompt_token_ids=[1, 2],
        token_ids=token_ids,
        logprobs=[-0.5 if m else 0.0 for m in mask],
        loss_mask=mask,
        turns=turns,
        stop_reason="done",
        response="",
        reward=reward,
    )


def one_turn(reward: float, tokens: int) -> Trajectory:
    return Trajectory(
        task_index=0,
        sample_index=0,
        prompt_token_ids=[1, 2],
        token_ids=[10] * tokens,
        logprobs=[-0.5] * tokens,
        loss_mask=[1] * tokens,
        turns=[TurnInfo(kind="model", start=0, end=tokens, text="")],
        stop_reason="done",
        response="",
        reward=reward,
    )


def group(*rewards: float | None, model_tokens: int = 2) -> RolloutGroup:
    return RolloutGroup(
        task_index=0, task_id=None, trajectories=[trajectory(r, model_tokens) for r in rewards]
    )


def test_trajectory_datum_trains_only_model_tokens() -> None:
    datum = trajectory_datum(trajectory(1.0, model_tokens=3), advantage=2.0)
    assert datum.input_ids == [1, 2, 10, 11, 20, 21, 30]
    assert datum.loss_mask == [0, 0, 1, 1, 0, 0, 1]
    assert datum.advantages == [0, 0, 2, 2, 0, 0, 2]
    assert datum.logprobs == [0, 0, -0.5, -0.5, 0, 0, -0.5]


def test_dapo_drops_zero_variance_and_unscored_groups() -> None:
    batch = dapo(max_tokens=64).batch([group(1.0, 0.0), group(1.0, 1.0), group(None, 1.0)])
    assert (batch.groups, batch.kept, batch.zero_variance, batch.unscored) == (3, 1, 1, 1)
    assert len(batch.data) == 2
    assert batch.rewards == [1.0, 0.0, 1.0, 1.0]
    assert batch.mean_reward == 0.75


def test_grpo_keeps_zero_variance_groups_with_zero_advantage() -> None:
    batch = grpo().batch([group(1.0, 1.0)])
    assert batch.kept == 1 and batch.zero_variance == 1
    assert all(a == 0.0 for d in batch.data for a in d.advantages or [])


def test_dapo_overlong_shaping_changes_the_advantages() -> None:
    # max 4 model tokens a turn, buffer 2: a 3-token turn costs 0.5 of reward, 2 tokens nothing
    algo = dapo(max_tokens=4, overlong_buffer=2)
    batch = algo.batch(
        [
            RolloutGroup(
                task_index=0, task_id=None, trajectories=[one_turn(1.0, 3), one_turn(1.0, 2)]
            )
        ]
    )
    assert batch.rewards == [0.5, 1.0]
    assert batch.kept == 0 and batch.zero_variance == 1  # both were right: no signal (DAPO)
    mixed = algo.batch(
        [
            RolloutGroup(
                task_index=0,
                task_id=None,
                trajectories=[one_turn(1.0, 3), one_turn(1.0, 2), one_turn(0.0, 2)],
            )
        ]
    )
    first, second, _ = mixed.data
    assert first.advantages is not None and second.advantages is not None
    # shaped 0.5, 1.0, 0.0: the long right answer sits at the mean, the short one above it
    assert max(first.advantages) == 0.0 and max(second.advantages) > 0


def test_overlong_shaping_is_per_turn_in_a_multi_turn_episode() -> None:
    """Two model turns of 2 tokens around a tool turn: 4 model tokens in all, each turn
    within its budget of 2 + buffer. Summed over the episode it would have cost 1.0."""
    algo = dapo(max_tokens=4, overlong_buffer=2)
    episode = trajectory(1.0, model_tokens=4)
    assert sum(episode.loss_mask) == 4
    assert algo.shaped_rewards([episode]) == [1.0]
    assert algo.shaped_rewards([one_turn(1.0, 5)]) == [0.0]  # one turn over the budget


def test_recipes_pick_matching_losses() -> None:
    assert grpo().loss.aggregation == LossAggregation.sequence_mean
    assert dr_grpo(max_tokens=128).loss.normalizer == 128
    assert dapo(max_tokens=64).loss.clip_high > dapo(max_tokens=64).loss.clip_low
    assert rloo(tis_cap=2.0).loss.tis_cap == 2.0
