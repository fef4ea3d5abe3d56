"""Group-relative advantages and reward shaping.

Each prompt is sampled `G` times; a completion's advantage is its reward relative to its
group's:
- GRPO: (r - mean) / (std + eps), std the sample standard deviation (n - 1, as TRL and verl;
  `std="population"` divides by n, a learning rate √(G / (G - 1)) larger);
- Dr. GRPO: r - mean (dividing by the std favours too-easy and too-hard prompts);
- RLOO: r minus the mean of the *other* G - 1 rewards, an unbiased baseline.
DAPO keeps GRPO's advantages but drops zero-variance groups (`has_signal`) and shapes the
reward of over-long responses (`overlong_penalty`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

Advantages = Callable[[Sequence[float]], list[float]]


def group_advantages(
    rewards: Sequence[float],
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
    std: Literal["sample", "population"] = "sample",
) -> list[float]:
    """Advantages of one group of rewards: (r - mean) / (std + eps), or r - mean (Dr.GRPO).
    A group of one has no spread to compare with: advantage 0."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    centered = [r - mean for r in rewards]
    if not normalize_std:
        return centered
    dof = len(centered) - (1 if std == "sample" else 0)
    if dof <= 0:
        return [0.0] * len(centered)
    spread = math.sqrt(sum(c * c for c in centered) / dof)
    return [c / (spread + eps) for c in centered]


Std = Literal["sample", "population"]


def grpo_advantages(rewards: Sequence[float], std: Std = "sample") -> list[float]:
    return group_advantages(rewards, std=std)


def dr_grpo_advantages(rewards: Sequence[float]) -> list[float]:
    return group_advantages(rewards, normalize_std=False)


def rloo_advantages(rewards: Sequence[float]) -> list[float]:
    """r_i - mean(r_j, j != i), which is G / (G - 1) * (r_i - mean). A group of one has no
    baseline to compare with: advantage 0."""
    n = len(rewards)
    if n < 2:
        return [0.0] * n
    total = sum(rewards)
    return [r - (total - r) / (n - 1) for r in rewards]


def has_signal(rewards: Sequence[float], tol: float = 1e-9) -> bool:
    """False for a zero-variance group (all right or all wrong): it teaches nothing (DAPO)."""
    return bool(rewards) and max(rewards) - min(rewards) > tol


def overlong_penalty(num_tokens: int, max_tokens: int, buffer: int) -> float:
    """DAPO's soft over-long punishment, added to the reward: 0 up to `max_tokens - buffer`
    tokens, then falling linearly to -1 at `max_tokens` (and -1 beyond)."""
    if buffer <= 0 or num_tokens <= max_tokens - buffer:
        return 0.0
    if num_tokens > max_tokens:
        return -1.0
    return (max_tokens - buffer - num_tokens) / buffer
