"""Built-in losses: pure functions of per-token tensors.

Every tensor is [B, T]: position i refers to predicting token i of the sequence (position 0,
padding and prompt tokens have `mask` 0). `mask` holds non-negative token weights.

Aggregation (`LossConfig.aggregation`) turns per-token terms into one number, never depending
on padding:
- token_mean (default, DAPO): sum(x * mask) / sum(mask) over the whole batch, so every token
  weighs the same and long sequences weigh more than short ones;
- sequence_mean (GRPO as published): the mean over sequences of each one's token mean;
- sum_normalized (Dr. GRPO): sum(x * mask) / (sequences * normalizer), a constant denominator
  that removes the length bias of dividing by each sequence's own length;
- sum (Tinker's losses): sum(x * mask), the caller's weights being the whole normalization.
The caller guarantees sum(mask) > 0. Gradients of several `forward_backward` calls add up
until the optimizer step, so each call's aggregate counts once. Metrics are token means.

Every aggregate and metric divides by the whole batch's totals (`Totals`), so a micro-batch's
values are its share of the batch's: the shares add up to the batch's loss and metrics, and
each micro-batch can be back-propagated, and its graph freed, before the next one runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from services.trainer.schemas import LossAggregation, LossConfig, LossName

LossOutput = tuple[Tensor, dict[str, float]]

# exp() of a log-ratio beyond this overflows float32 and turns gradients into NaN; a token this
# far off-policy carries no usable signal, so its log-ratio is clamped (as verl does).
MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class Totals:
    """The whole batch's denominators, taken from its loss mask before any micro-batch runs."""

    weight: float  # sum of the loss mask
    sequences: int
    counted_sequences: int  # sequences with any loss weight

    @classmethod
    def of(cls, mask: Tensor) -> Totals:
        per_sequence = mask.sum(dim=1)
        return cls(float(mask.sum()), int(mask.shape[0]), int((per_sequence > 0).sum()))


@dataclass(frozen=True)
class Aggregate:
    """Per-token values -> a micro-batch's share of the batch's loss (`__call__`) or of a
    token-mean metric (`token_mean`)."""

    aggregation: LossAggregation
    totals: Totals
    normalizer: float = 1.0

    def __call__(self, values: Tensor, mask: Tensor) -> Tensor:
        weighted = values * mask
        if self.aggregation == LossAggregation.sequence_mean:
            per_sequence = mask.sum(dim=1)
            counted = per_sequence > 0
            means = weighted.sum(dim=1)[counted] / per_sequence[counted]
            return means.sum() / self.totals.counted_sequences
        if self.aggregation == LossAggregation.sum:
            return weighted.sum()
        if self.aggregation == LossAggregation.sum_normalized:
            return weighted.sum() / (self.totals.sequences * self.normalizer)
        return weighted.sum() / self.totals.weight

    def token_mean(self, values: Tensor, mask: Tensor) -> Tensor:
        return (values * mask).sum() / self.totals.weight


def aggregator(config: LossConfig, totals: Totals) -> Aggregate:
    return Aggregate(config.aggregation, totals, float(config.normalizer or 1))


def whole_batch_mean(mask: Tensor) -> Aggregate:
    """The token mean over `mask` itself: what a loss aggregates when given the whole batch."""
    return Aggregate(LossAggregation.token_mean, Totals.of(mask))


def _log_ratio(numerator: Tensor, denominator: Tensor, mask: Tensor) -> Tensor:
    """log(numerator / denominator), 0 where the mask is 0, so unmasked garbage (position 0,
    padding) can never reach exp() and poison the gradient with inf * 0."""
    diff = (numerator - denominator).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return torch.where(mask > 0, diff, torch.zeros_like(diff))


def cross_entropy(logprobs: Tensor, mask: Tensor, aggregate: Aggregate | None = None) -> LossOutput:
    loss = (aggregate or whole_batch_mean(mask))(-logprobs, mask)
    return loss, {}


def importance_sampling(
    logprobs: Tensor,
    mask: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    aggregate: Aggregate | None = None,
) -> LossOutput:
    """-mean(ratio * A), ratio = exp(new - old): the policy gradient, corrected for samples
    drawn by an older policy."""
    aggregate = aggregate or whole_batch_mean(mask)
    ratio = torch.exp(_log_ratio(logprobs, old_logprobs, mask))
    loss = -aggregate(ratio * advantages, mask)
    return loss, {"ratio_mean": aggregate.token_mean(ratio, mask).item()}


def ppo(
    logprobs: Tensor,
    mask: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    clip_low: float,
    clip_high: float,
    aggregate: Aggregate | None = None,
    dual_clip: float | None = None,
) -> LossOutput:
    """-mean(min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)). An upper bound
    above the lower one ("clip-higher", DAPO) leaves low-probability tokens room to grow.
    `dual_clip` c (dual-clip PPO): where A < 0 the term is at least c * A, so a stale token
    with a huge ratio cannot blow the loss up.

    clip_fraction: the share of (weighted) tokens whose clipped term is the smaller one, i.e.
    whose gradient the clip switched off."""
    aggregate = aggregate or whole_batch_mean(mask)
    ratio = torch.exp(_log_ratio(logprobs, old_logprobs, mask))
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    objective = torch.minimum(unclipped, clipped)
    metrics = {
        "clip_fraction": aggregate.token_mean((clipped < unclipped).to(mask.dtype), mask).item(),
        "ratio_mean": aggregate.token_mean(ratio, mask).item(),
    }
    if dual_clip is not None:
        floor = dual_clip * advantages
        capped = (advantages < 0) & (objective < floor)
        objective = torch.where(capped, floor, objective)
        metrics["dual_clip_fraction"] = aggregate.token_mean(capped.to(mask.dtype), mask).item()
    return -aggregate(objective, mask), metrics


def cispo(
    logprobs: Tensor,
    mask: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    clip_low: float,
    clip_high: float,
    aggregate: Aggregate | None = None,
) -> LossOutput:
    """-mean(sg(clip(ratio, 1 - clip_low, 1 + clip_high)) * log pi * A) (CISPO): the clip
    bounds each token's coefficient instead of switching its gradient off as PPO's does.

    clip_fraction: the share of (weighted) tokens whose ratio the clip changed."""
    aggregate = aggregate or whole_batch_mean(mask)
    ratio = torch.exp(_log_ratio(logprobs, old_logprobs, mask)).detach()
    coefficient = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = -aggregate(coefficient * logprobs * advantages, mask)
    return loss, {
        "clip_fraction": aggregate.token_mean((coefficient != ratio).to(mask.dtype), mask).item(),
        "ratio_mean": aggregate.token_mean(ratio, mask).item(),
    }


def dro(
    logprobs: Tensor,
    mask: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    beta: float,
    aggregate: Aggregate | None = None,
) -> LossOutput:
    """-mean(log pi * A - beta / 2 * log(pi / pi_old)^2) (DRO): off-policy learning held near
    the sampler by a quadratic penalty rather than a clip; A is the caller's (soft) advantage."""
    aggregate = aggregate or whole_batch_mean(mask)
    log_ratio = _log_ratio(logprobs, old_logprobs, mask)
    penalty = 0.5 * beta * log_ratio**2
    loss = -aggregate(logprobs * advantages - penalty, mask)
    return loss, {
        "penalty_mean": aggregate.token_mean(penalty, mask).item(),
        "ratio_mean": aggregate.token_mean(torch.exp(log_ratio), mask).item(),
    }


def reinforce(
    logprobs: Tensor, mask: Tensor, advantages: Tensor, aggregate: Aggregate | None = None
) -> LossOutput:
    """-mean(log pi * A): the on-policy policy gradient. With A = -dL/dlogprob it is also how
    a loss L computed outside the trainer (an SDK's custom loss) reaches the weights: its
    gradient is exactly L's."""
    aggregate = aggregate or whole_batch_mean(mask)
    return -aggregate(logprobs * advantages, mask), {}


def k3(logprobs: Tensor, mask: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per token, the k3 estimator of KL(policy || reference): exp(ref - new) - (ref - new) - 1,
    which is unbiased, never negative, and low-variance for samples drawn from the policy."""
    log_ratio = _log_ratio(ref_logprobs, logprobs, mask)
    return torch.exp(log_ratio) - log_ratio - 1.0


def kl_to_reference(
    logprobs: Tensor, mask: Tensor, ref_logprobs: Tensor, aggregate: Aggregate | None = None
) -> Tensor:
    """The token mean of `k3`: the KL as a metric reports it."""
    aggregate = aggregate or whole_batch_mean(mask)
    return aggregate.token_mean(k3(logprobs, mask, ref_logprobs), mask)


def truncated_is_weights(
    logprobs: Tensor,
    sampler_logprobs: Tensor,
    mask: Tensor,
    cap: float,
    aggregate: Aggregate | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """min(pi / pi_sampler, cap) per token, without gradient (`logprobs`: the trainer's
    proximal policy): corrects samples that an older version (or a sampler whose numerics
    differ from the trainer's) produced, and the cap bounds the variance a rare token could
    add."""
    raw = torch.exp(_log_ratio(logprobs.detach(), sampler_logprobs, mask))
    weights = raw.clamp(max=cap)
    aggregate = aggregate or whole_batch_mean(mask)
    return weights, {
        "tis_weight_mean": aggregate.token_mean(weights, mask).item(),
        "tis_truncated_fraction": aggregate.token_mean((raw > cap).to(mask.dtype), mask).item(),
    }


def policy_loss(
    config: LossConfig,
    logprobs: Tensor,
    mask: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    aggregate: Aggregate,
) -> LossOutput:
    """One of the losses that weigh advantages by a ratio to the sampler's logprobs."""
    clip_low, clip_high = config.clips
    if config.name == LossName.importance_sampling:
        return importance_sampling(logprobs, mask, old_logprobs, advantages, aggregate)
    if config.name == LossName.ppo:
        return ppo(
            logprobs,
            mask,
            old_logprobs,
            advantages,
            clip_low,
            clip_high,
            aggregate,
            config.clip_ratio_c,
        )
    if config.name == LossName.cispo:
        return cispo(logprobs, mask, old_logprobs, advantages, clip_low, clip_high, aggregate)
    if config.name == LossName.dro:
        return dro(logprobs, mask, old_logprobs, advantages, config.dro_beta, aggregate)
    raise ValueError(f"{config.name.value} is not a ratio loss")


def compute_loss(
    config: LossConfig,
    logprobs: Tensor,
    mask: Tensor,
    *,
    old_logprobs: Tensor | None = None,
    advantages: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    proximal_logprobs: Tensor | None = None,
    totals: Totals | None = None,
) -> LossOutput:
    """The configured loss, plus kl_coef * KL when a reference is given and kl_coef > 0.

    With `tis_cap`, `old_logprobs` are the sampler's: the advantages are weighted by the
    truncated ratio of the proximal policy to them, and the policy ratio (with its clip) is
    taken against the proximal policy: `proximal_logprobs` (a later pass on the same batch
    gives those of the weights before its first update), else the current weights.

    `totals`: the whole batch's, when these tensors are one of its micro-batches (the loss and
    metrics returned are then this micro-batch's shares); None: these tensors are the batch."""
    aggregate = aggregator(config, totals or Totals.of(mask))
    metrics: dict[str, float] = {}
    if config.name == LossName.cross_entropy:
        loss, metrics = cross_entropy(logprobs, mask, aggregate)
    elif advantages is None:
        raise ValueError(f"loss {config.name.value!r} needs advantages")
    elif config.name == LossName.reinforce:
        loss, metrics = reinforce(logprobs, mask, advantages, aggregate)
    else:
        if old_logprobs is None:
            raise ValueError(f"loss {config.name.value!r} needs old_logprobs")
        if config.tis_cap is not None:
            proximal = logprobs.detach() if proximal_logprobs is None else proximal_logprobs
            weights, metrics = truncated_is_weights(
                proximal, old_logprobs, mask, config.tis_cap, aggregate
            )
            advantages, old_logprobs = advantages * weights, proximal
        loss, policy_metrics = policy_loss(
            config, logprobs, mask, old_logprobs, advantages, aggregate
        )
        metrics = {**metrics, **policy_metrics}
    if config.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        terms = k3(logprobs, mask, ref_logprobs)
        metrics = {
            **metrics,
            "policy_loss": loss.item(),
            "kl": aggregate.token_mean(terms, mask).item(),
        }
        # Aggregated like the policy loss, so kl_coef weighs the same whatever the aggregation.
        loss = loss + config.kl_coef * aggregate(terms, mask)
    return loss, metrics
