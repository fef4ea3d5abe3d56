"""Algorithms: how rewards become advantages, which groups are kept, and the
trainer loss that matches. `Algorithm.batch(groups)` turns streamed rollout groups into
trainer data.

    algo = dapo(max_tokens=256)
    batch = algo.batch(groups)
    job.forward_backward(batch.data, algo.loss)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

from agents.algorithms.advantages import (
    Advantages,
    Std,
    dr_grpo_advantages,
    grpo_advantages,
    has_signal,
    overlong_penalty,
    rloo_advantages,
)
from agents.algorithms.data import trajectory_datum
from services.rollout.schemas import RolloutGroup, Trajectory
from services.trainer.schemas import Datum, LossAggregation, LossConfig, LossName


@dataclass(frozen=True)
class OverlongShaping:
    """DAPO: a response longer than `max_tokens - buffer` tokens loses up to 1 reward. The
    budget is per model turn (`max_tokens` is what each turn may generate): a multi-turn
    episode is shaped by its longest turn, never by the sum of its turns."""

    max_tokens: int
    buffer: int

    def penalty(self, trajectory: Trajectory) -> float:
        turns = [t.end - t.start for t in trajectory.turns if t.kind == "model"]
        return min((overlong_penalty(n, self.max_tokens, self.buffer) for n in turns), default=0.0)


@dataclass
class TrainingBatch:
    data: list[Datum]
    groups: int = 0  # groups seen
    kept: int = 0  # groups that became data
    zero_variance: int = 0  # dropped: every reward equal
    unscored: int = 0  # dropped: the reward service could not score a trajectory
    rewards: list[float] = field(default_factory=list)  # every scored trajectory's, shaped

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / len(self.rewards) if self.rewards else 0.0


@dataclass(frozen=True)
class Algorithm:
    name: str
    advantages: Advantages
    loss: LossConfig
    filter_zero_variance: bool = False
    overlong: OverlongShaping | None = None

    def shaped_rewards(self, trajectories: Sequence[Trajectory]) -> list[float]:
        rewards = [t.reward or 0.0 for t in trajectories]
        if self.overlong is None:
            return rewards
        return [r + self.overlong.penalty(t) for r, t in zip(rewards, trajectories, strict=True)]

    def batch(self, groups: Sequence[RolloutGroup]) -> TrainingBatch:
        batch = TrainingBatch(data=[])
        for group in groups:
            batch.groups += 1
            if any(t.reward is None for t in group.trajectories):
                batch.unscored += 1
                continue
            rewards = self.shaped_rewards(group.trajectories)
            batch.rewards.extend(rewards)
            # Dynamic sampling looks at what the verifier said (DAPO filters on accuracy); the
            # shaped reward is what the advantages are made of.
            if not has_signal([t.reward or 0.0 for t in group.trajectories]):
                batch.zero_variance += 1
                if self.filter_zero_variance:
                    continue
            batch.kept += 1
            batch.data.extend(
                trajectory_datum(t, a)
                for t, a in zip(group.trajectories, self.advantages(rewards), strict=True)
            )
        return batch


def grpo(
    *, clip: float = 0.2, kl_coef: float = 0.0, tis_cap: float | None = None, std: Std = "sample"
) -> Algorithm:
    """GRPO as published: std-normalised advantages (`std`: the group's sample standard
    deviation, as TRL and verl, or its population one), symmetric clip, each sequence's token
    mean averaged over sequences."""
    return Algorithm(
        "grpo",
        partial(grpo_advantages, std=std),
        LossConfig(
            name=LossName.ppo,
            clip_low=clip,
            clip_high=clip,
            kl_coef=kl_coef,
            tis_cap=tis_cap,
            aggregation=LossAggregation.sequence_mean,
        ),
    )


def dr_grpo(*, max_tokens: int, clip: float = 0.2, tis_cap: float | None = None) -> Algorithm:
    """Dr. GRPO: centred advantages, token sums over a constant (the generation budget)."""
    return Algorithm(
        "dr_grpo",
        dr_grpo_advantages,
        LossConfig(
            name=LossName.ppo,
            clip_low=clip,
            clip_high=clip,
            tis_cap=tis_cap,
            aggregation=LossAggregation.sum_normalized,
            normalizer=max_tokens,
        ),
    )


def dapo(
    *,
    max_tokens: int,
    overlong_buffer: int = 0,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    tis_cap: float | None = None,
    std: Std = "sample",
) -> Algorithm:
    """DAPO: clip-higher, token-level mean, dynamic sampling (zero-variance groups dropped;
    over-sample to keep the batch full) and over-long reward shaping."""
    overlong = OverlongShaping(max_tokens, overlong_buffer) if overlong_buffer else None
    return Algorithm(
        "dapo",
        partial(grpo_advantages, std=std),
        LossConfig(
            name=LossName.ppo,
            clip_low=clip_low,
            clip_high=clip_high,
            tis_cap=tis_cap,
            aggregation=LossAggregation.token_mean,
        ),
        filter_zero_variance=True,
        overlong=overlong,
    )


def rloo(*, tis_cap: float | None = None) -> Algorithm:
    """RLOO: leave-one-out baselines, the plain importance-sampled policy gradient."""
    return Algorithm(
        "rloo",
        rloo_advantages,
        LossConfig(
            name=LossName.importance_sampling,
            tis_cap=tis_cap,
            aggregation=LossAggregation.token_mean,
        ),
    )
