"""The learning-rate schedule the demo's SFT uses."""

from __future__ import annotations

import math

import pytest

from agents.algorithms.schedules import warmup_cosine


def test_warms_up_linearly_then_decays_to_the_final_fraction_and_stays() -> None:
    factors = [warmup_cosine(step, 10, 100, 0.1) for step in range(1, 201)]
    assert factors[:10] == pytest.approx(
        [0.1 * s * (0.1 + 0.9 * _cos(s, 100)) for s in range(1, 11)]
    )
    assert factors[99] == pytest.approx(0.1) and factors[-1] == pytest.approx(0.1)
    after_warmup = factors[9:100]
    assert all(a > b for a, b in zip(after_warmup, after_warmup[1:], strict=False))
    assert warmup_cosine(50, 0, 100, 0.0) == pytest.approx(0.5)  # no warm-up: halfway down


def _cos(step: int, decay: int) -> float:
    return 0.5 * (1 + math.cos(math.pi * step / decay))


@pytest.mark.parametrize(("decay", "final"), [(0, 0.1), (100, -0.1), (100, 1.5)])
def test_bad_settings_are_refused(decay: int, final: float) -> None:
    with pytest.raises(ValueError):
        warmup_cosine(1, 10, decay, final)
