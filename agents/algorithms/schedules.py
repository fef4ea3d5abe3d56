"""Learning-rate schedules: a step's multiplier of the base rate (scripts pass the product
to `optim_step` each step; the trainer keeps no schedule of its own)."""

from __future__ import annotations

import math


def warmup_cosine(step: int, warmup_steps: int, decay_steps: int, final_fraction: float) -> float:
    """Linear warm-up over the first `warmup_steps` (step 1 is the first), then a cosine from
    1 down to `final_fraction` at `decay_steps`, flat after it."""
    if not 0.0 <= final_fraction <= 1.0:
        raise ValueError(f"final_fraction must be within [0, 1], not {final_fraction}")
    if decay_steps < 1:
        raise ValueError(f"decay_steps must be at least 1, not {decay_steps}")
    warm = min(1.0, step / warmup_steps) if warmup_steps > 0 else 1.0
    progress = min(1.0, step / decay_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return warm * (final_fraction + (1.0 - final_fraction) * cosine)
