"""Group-relative advantages (GRPO family).

Each prompt is sampled `G` times; a completion's advantage is its reward relative to its
group's: GRPO divides by the group's standard deviation, Dr.GRPO does not (it removes the
difficulty bias that std-normalisation introduces).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def group_advantages(
    rewards: Sequence[float], *, normalize_std: bool = True, eps: float = 1e-6
) -> list[float]:
    """Advantages of one group of rewards: (r - mean) / (std + eps), or r - mean (Dr.GRPO)."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    centered = [r - mean for r in rewards]
    if not normalize_std:
        return centered
    std = math.sqrt(sum(c * c for c in centered) / len(centered))
    return [c / (std + eps) for c in centered]


def has_signal(rewards: Sequence[float], tol: float = 1e-9) -> bool:
    """False for a zero-variance group (all right or all wrong): it teaches nothing (DAPO)."""
    return bool(rewards) and max(rewards) - min(rewards) > tol
