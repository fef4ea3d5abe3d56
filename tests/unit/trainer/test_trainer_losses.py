"""Losses against numbers worked out by hand from their formulas."""

from __future__ import annotations

import math

import pytest
import torch

from services.trainer.losses import (
    Aggregate,
    Totals,
    cispo,
    compute_loss,
    cross_entropy,
    dro,
    importance_sampling,
    kl_to_reference,
    ppo,
    reinforce,
)
from services.trainer.schemas import LossAggregation, LossConfig, LossName

LN2 = math.log(2.0)


def summed(mask: torch.Tensor) -> Aggregate:
    """The plain token sum as the loss; metrics stay token means over `mask`."""
    return Aggregate(LossAggregation.sum, Totals.of(mask))


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def test_cross_entropy_is_a_token_mean_over_the_whole_batch() -> None:
    logprobs = t([[0.0, -1.0, -2.0], [0.0, -0.5, -3.0]])
    mask = t([[0, 1, 1], [0, 1, 0]])
    loss, _ = cross_entropy(logprobs, mask)
    assert loss.item() == pytest.approx((1.0 + 2.0 + 0.5) / 3)


def test_cross_entropy_mask_values_are_weights() -> None:
    loss, _ = cross_entropy(t([[0.0, -1.0, -4.0]]), t([[0, 2, 1]]))
    assert loss.item() == pytest.approx((2 * 1.0 + 1 * 4.0) / 3)


def test_cross_entropy_gradient_is_minus_mask_over_token_count() -> None:
    logprobs = t([[0.0, -1.0, -2.0]]).requires_grad_()
    loss, _ = cross_entropy(logprobs, t([[0, 1, 1]]))
    loss.backward()
    assert logprobs.grad is not None
    assert logprobs.grad[0].tolist() == pytest.approx([0.0, -0.5, -0.5])


def test_importance_sampling() -> None:
    new = t([[0.0, -0.5, -1.0]])
    old = t([[0.0, -0.5 - LN2, -1.0 + LN2]])  # ratios 2 and 1/2
    advantages = t([[0.0, 1.0, -2.0]])
    loss, metrics = importance_sampling(new, t([[0, 1, 1]]), old, advantages)
    # -(2 * 1 + 0.5 * -2) / 2
    assert loss.item() == pytest.approx(-0.5)
    assert metrics["ratio_mean"] == pytest.approx(1.25)


def test_ppo_clips_and_counts_clipped_tokens() -> None:
    new = t([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    # ratios: row 0 -> 2, 0.5; row 1 -> 1, 2
    old = t([[0.0, -LN2, LN2], [0.0, 0.0, -LN2]])
    advantages = t([[0.0, 1.0, -2.0], [0.0, 3.0, -1.0]])
    mask = t([[0, 1, 1], [0, 1, 1]])
    loss, metrics = ppo(new, mask, old, advantages, clip_low=0.2, clip_high=0.28)
    # min(2*1, 1.28*1) = 1.28 (clipped); min(0.5*-2, 0.8*-2) = -1.6 (clipped);
    # min(1*3, 1*3) = 3; min(2*-1, 1.28*-1) = -2 (unclipped)
    assert loss.item() == pytest.approx(-(1.28 - 1.6 + 3.0 - 2.0) / 4)
    assert metrics["clip_fraction"] == pytest.approx(0.5)
    assert metrics["ratio_mean"] == pytest.approx((2 + 0.5 + 1 + 2) / 4)


def test_ppo_clip_higher_is_asymmetric() -> None:
    new = t([[0.0, 0.0, 0.0]])
    old = t([[0.0, -math.log(1.25), -math.log(0.75)]])  # ratios 1.25 and 0.75
    advantages = t([[0.0, 1.0, -1.0]])
    loss, metrics = ppo(new, t([[0, 1, 1]]), old, advantages, clip_low=0.2, clip_high=0.28)
    # 1.25 is inside [0.8, 1.28]: 1.25; 0.75 is below 0.8: min(-0.75, -0.8) = -0.8
    assert loss.item() == pytest.approx(-(1.25 - 0.8) / 2)
    assert metrics["clip_fraction"] == pytest.approx(0.5)


def test_kl_k3_estimator() -> None:
    new = t([[0.0, 0.0, 0.0, 0.0]])
    ref = t([[5.0, LN2, -LN2, 0.0]])  # position 0 is masked out
    kl = kl_to_reference(new, t([[0, 1, 1, 1]]), ref)
    # (2 - ln2 - 1) + (0.5 + ln2 - 1) + 0 = 0.5, over 3 tokens
    assert kl.item() == pytest.approx(0.5 / 3)


def test_compute_loss_adds_weighted_kl() -> None:
    new = t([[0.0, -1.0, -1.0]])
    ref = t([[0.0, -1.0 + LN2, -1.0 - LN2]])
    config = LossConfig(name=LossName.cross_entropy, kl_coef=0.1)
    loss, metrics = compute_loss(config, new, t([[0, 1, 1]]), ref_logprobs=ref)
    assert metrics["policy_loss"] == pytest.approx(1.0)
    assert metrics["kl"] == pytest.approx(0.5 / 2)
    assert loss.item() == pytest.approx(1.0 + 0.1 * 0.25)


def test_masked_garbage_cannot_poison_gradients() -> None:
    """A huge sampler logprob at an unmasked position must not give inf * 0 = NaN."""
    new = t([[0.0, -1.0, -1.0]]).requires_grad_()
    old = t([[-1000.0, -1.0, -1.0]])
    loss, _ = ppo(new, t([[0, 1, 1]]), old, t([[5.0, 1.0, 1.0]]), 0.2, 0.28)
    loss.backward()
    assert new.grad is not None
    assert torch.isfinite(loss) and torch.isfinite(new.grad).all()
    assert loss.item() == pytest.approx(-1.0)


def test_policy_losses_need_old_logprobs_and_advantages() -> None:
    with pytest.raises(ValueError, match="needs advantages"):
        compute_loss(LossConfig(name=LossName.ppo), t([[0.0, -1.0]]), t([[0, 1]]))
    with pytest.raises(ValueError, match="needs old_logprobs"):
        compute_loss(
            LossConfig(name=LossName.dro), t([[0.0, -1.0]]), t([[0, 1]]), advantages=t([[0.0, 1.0]])
        )


def test_cispo_weighs_log_pi_by_the_clipped_ratio_without_its_gradient() -> None:
    new = t([[0.0, -1.0, -2.0, -0.5]]).requires_grad_()
    # ratios 2, 1/2 and 1; bounds [0.8, 1.5] clip the first two to 1.5 and 0.8
    old = t([[0.0, -1.0 - LN2, -2.0 + LN2, -0.5]])
    advantages = t([[0.0, 1.0, -2.0, 3.0]])
    mask = t([[0, 1, 1, 1]])
    loss, metrics = cispo(new, mask, old, advantages, 0.2, 0.5, summed(mask))
    # -(1.5 * -1 * 1 + 0.8 * -2 * -2 + 1 * -0.5 * 3) = -(-1.5 + 3.2 - 1.5)
    assert loss.item() == pytest.approx(-0.2)
    assert metrics["clip_fraction"] == pytest.approx(2 / 3)
    loss.backward()
    assert new.grad is not None  # the coefficient is a constant: d/dlogpi = -coef * A
    assert new.grad[0].tolist() == pytest.approx([0.0, -1.5, 1.6, -3.0])


def test_cispo_defaults_cap_the_ratio_at_four_with_no_lower_bound() -> None:
    config = LossConfig(name=LossName.cispo)
    assert config.clips == (1.0, 3.0)
    new = t([[0.0, 0.0, 0.0]])
    old = t([[0.0, -math.log(8.0), math.log(8.0)]])  # ratios 8 and 1/8
    loss, metrics = compute_loss(
        config, new - 1.0, t([[0, 1, 1]]), old_logprobs=old - 1.0, advantages=t([[0.0, 1.0, 1.0]])
    )
    # logpi = -1 for both: -(4 * -1 + 0.125 * -1) / 2 (token mean)
    assert loss.item() == pytest.approx((4.0 + 0.125) / 2)
    assert metrics["clip_fraction"] == pytest.approx(0.5)


def test_dro_is_the_policy_gradient_minus_a_quadratic_penalty() -> None:
    new = t([[0.0, -1.0, -2.0]]).requires_grad_()
    old = t([[0.0, -1.5, -2.0]])  # log-ratios 0.5 and 0
    advantages = t([[0.0, 2.0, -1.0]])
    mask = t([[0, 1, 1]])
    loss, metrics = dro(new, mask, old, advantages, 0.4, summed(mask))
    # -((-1 * 2 - 0.5 * 0.4 * 0.25) + (-2 * -1 - 0))
    assert loss.item() == pytest.approx(0.05)
    assert metrics["penalty_mean"] == pytest.approx(0.05 / 2)
    loss.backward()
    assert new.grad is not None  # -(A - beta * log-ratio)
    assert new.grad[0].tolist() == pytest.approx([0.0, -(2.0 - 0.4 * 0.5), 1.0])


def test_reinforce_with_minus_a_gradient_passes_that_gradient_through() -> None:
    """An SDK's client-side loss L arrives as A = -dL/dlogprob: the trainer's gradient is
    exactly dL/dlogprob, and the loss value -sum(A * logprob)."""
    logprobs = t([[0.0, -1.0, -2.0]]).requires_grad_()
    client_gradient = [0.0, 0.25, -3.0]
    mask = t([[0, 1, 1]])
    loss, _ = reinforce(logprobs, mask, -t([client_gradient]), summed(mask))
    assert loss.item() == pytest.approx(0.25 * -1.0 + -3.0 * -2.0)
    loss.backward()
    assert logprobs.grad is not None
    assert logprobs.grad[0].tolist() == pytest.approx(client_gradient)


def test_sequence_mean_averages_each_sequences_token_mean() -> None:
    logprobs = t([[0.0, -1.0, -2.0], [0.0, -0.5, -3.0], [0.0, -9.0, -9.0]])
    mask = t([[0, 1, 1], [0, 1, 0], [0, 0, 0]])  # the third row has no loss tokens: not counted
    config = LossConfig(aggregation=LossAggregation.sequence_mean)
    loss, _ = compute_loss(config, logprobs, mask)
    assert loss.item() == pytest.approx(((1.0 + 2.0) / 2 + 0.5) / 2)


def test_sum_normalized_divides_by_sequences_times_the_constant() -> None:
    logprobs = t([[0.0, -1.0, -2.0], [0.0, -0.5, -3.0]])
    mask = t([[0, 1, 1], [0, 1, 0]])
    config = LossConfig(aggregation=LossAggregation.sum_normalized, normalizer=4)
    loss, _ = compute_loss(config, logprobs, mask)
    assert loss.item() == pytest.approx((1.0 + 2.0 + 0.5) / (2 * 4))


def test_sum_is_the_weighted_token_sum() -> None:
    """Tinker's cross_entropy: sum(-weights * logprob), fractional weights included."""
    logprobs = t([[0.0, -1.0, -2.0], [0.0, -0.5, -3.0]])
    mask = t([[0, 1, 0.5], [0, 2, 0]])
    loss, _ = compute_loss(LossConfig(aggregation=LossAggregation.sum), logprobs, mask)
    assert loss.item() == pytest.approx(1.0 + 0.5 * 2.0 + 2 * 0.5)


def test_sum_normalized_needs_its_constant() -> None:
    with pytest.raises(ValueError, match="normalizer is required"):
        LossConfig(aggregation=LossAggregation.sum_normalized)
    with pytest.raises(ValueError, match="means nothing"):
        LossConfig(normalizer=8)


def test_truncated_importance_sampling_weights_and_gradient() -> None:
    new = t([[0.0, 0.0, 0.0]]).requires_grad_()
    sampler = t([[0.0, -LN2, LN2]])  # trainer / sampler ratios 2 and 1/2
    advantages = t([[0.0, 1.0, -2.0]])
    config = LossConfig(name=LossName.importance_sampling, tis_cap=1.5)
    loss, metrics = compute_loss(
        config, new, t([[0, 1, 1]]), old_logprobs=sampler, advantages=advantages
    )
    # weights min(2, 1.5) = 1.5 and 0.5; the policy ratio is 1: -(1.5 * 1 + 0.5 * -2) / 2
    assert loss.item() == pytest.approx(-0.25)
    assert metrics["tis_weight_mean"] == pytest.approx(1.0)
    assert metrics["tis_truncated_fraction"] == pytest.approx(0.5)
    loss.backward()
    assert new.grad is not None
    assert new.grad[0].tolist() == pytest.approx([0.0, -0.75, 0.5])  # -w * A / 2, w constant


def test_truncated_importance_sampling_under_ppo_on_a_first_pass() -> None:
    """A first pass: the proximal policy is the current weights, so the ratio is 1 and only the
    TIS weight acts."""
    new = t([[0.0, -1.0]])
    sampler = t([[0.0, -1.0 - 3.0]])  # ratio e^3, far outside the clip range
    config = LossConfig(name=LossName.ppo, tis_cap=2.0)
    loss, metrics = compute_loss(
        config, new, t([[0, 1]]), old_logprobs=sampler, advantages=t([[0.0, 1.0]])
    )
    assert loss.item() == pytest.approx(-2.0)
    assert metrics["clip_fraction"] == 0.0
    assert metrics["tis_truncated_fraction"] == 1.0


def test_a_later_pass_clips_against_the_proximal_policy_under_truncated_is() -> None:
    """The issue's case: a second pass on a token whose ratio to the policy before the first
    update is 1.65, with a positive advantage: the clip (1.28) switches its gradient off; the
    TIS weight is the proximal policy's ratio to the sampler, truncated."""
    proximal = t([[0.0, -1.0, -1.0]])
    new = (proximal + t([[0.0, math.log(1.65), math.log(1.1)]])).requires_grad_()
    sampler = t([[0.0, -1.0 - LN2, -1.0]])  # proximal / sampler: 2 (truncated to 1.5), 1
    advantages = t([[0.0, 1.0, 1.0]])
    config = LossConfig(name=LossName.ppo, tis_cap=1.5)
    loss, metrics = compute_loss(
        config,
        new,
        t([[0, 1, 1]]),
        old_logprobs=sampler,
        advantages=advantages,
        proximal_logprobs=proximal,
    )
    # -(min(1.65, 1.28) * 1.5 * 1 + 1.1 * 1 * 1) / 2
    assert loss.item() == pytest.approx(-(1.28 * 1.5 + 1.1) / 2)
    assert metrics["clip_fraction"] == pytest.approx(0.5)
    assert metrics["tis_weight_mean"] == pytest.approx(1.25)
    loss.backward()
    assert new.grad is not None  # clipped: no gradient; else -w * ratio * A / 2
    assert new.grad[0].tolist() == pytest.approx([0.0, 0.0, -1.1 / 2])


def test_dual_clip_bounds_a_negative_advantage_tokens_term() -> None:
    new = t([[0.0, 0.0, 0.0]]).requires_grad_()
    old = t([[0.0, -math.log(10.0), -math.log(1.1)]])  # ratios 10 and 1.1
    advantages = t([[0.0, -1.0, -1.0]])
    config = LossConfig(name=LossName.ppo, clip_ratio_c=3.0)
    loss, metrics = compute_loss(
        config, new, t([[0, 1, 1]]), old_logprobs=old, advantages=advantages
    )
    # ratio 10: min(-10, -1.28) = -10, floored at 3 * -1 = -3; ratio 1.1: -1.1
    assert loss.item() == pytest.approx((3.0 + 1.1) / 2)
    assert metrics["dual_clip_fraction"] == pytest.approx(0.5)
    loss.backward()
    assert new.grad is not None
    assert new.grad[0].tolist() == pytest.approx([0.0, 0.0, 1.1 / 2])
    without, _ = compute_loss(
        LossConfig(name=LossName.ppo), new, t([[0, 1, 1]]), old_logprobs=old, advantages=advantages
    )
    assert without.item() == pytest.approx((10.0 + 1.1) / 2)
    with pytest.raises(ValueError, match="dual clip"):
        LossConfig(name=LossName.cispo, clip_ratio_c=3.0)


def test_the_kl_term_is_aggregated_like_the_policy_loss() -> None:
    new = t([[0.0, -1.0, -2.0]])
    ref = t([[0.0, -1.5, -1.0]])
    mask = t([[0, 1, 1]])
    k3 = [math.exp(r - n) - (r - n) - 1 for r, n in ((-1.5, -1.0), (-1.0, -2.0))]
    for aggregation, scale in ((LossAggregation.sum, 1.0), (LossAggregation.token_mean, 0.5)):
        config = LossConfig(aggregation=aggregation, kl_coef=0.1)
        loss, metrics = compute_loss(config, new, mask, ref_logprobs=ref)
        policy = 3.0 * scale  # cross-entropy: -(-1 - 2)
        assert loss.item() == pytest.approx(policy + 0.1 * sum(k3) * scale)
        assert metrics["kl"] == pytest.approx(sum(k3) / 2)  # the metric stays a token mean


def test_options_a_loss_does_not_read_are_refused() -> None:
    with pytest.raises(ValueError, match="does not use"):
        LossConfig(tis_cap=2.0)
    with pytest.raises(ValueError, match="does not use"):
        LossConfig(name=LossName.reinforce, tis_cap=2.0)
    with pytest.raises(ValueError, match="apply to ppo and cispo"):
        LossConfig(name=LossName.dro, clip_high=0.5)
