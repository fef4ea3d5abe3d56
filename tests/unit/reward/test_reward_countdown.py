"""The countdown verifier: expressions over the given numbers, checked before evaluation."""

from __future__ import annotations

import pytest

from services.reward.countdown import CountdownParams, reference_of, score_countdown

REF = reference_of([3, 5, 7, 2], 22)


@pytest.mark.parametrize(
    ("response", "params", "reward"),
    [
        ("3*5+7", {}, 1.0),
        (" (7+3)*2 + 5 - 3 ", {}, 0.0),  # 3 used twice
        ("7*3+2-5+4", {}, 0.0),  # 4 is not a number of the task
        ("(5+7/7)", {}, 0.0),  # 7 used twice
        ("3*5+7 = 22", {}, 1.0),  # stating the value is fine
        ("7*2*5/5", {}, 0.0),  # 5 twice
        ("(3+5)*2+7-1", {}, 0.0),
        ("3*5+7", {"use_all": True}, 0.0),  # 2 unused
        ("(3*5+7)*2/2", {"use_all": True}, 0.0),  # 2 twice
        ("3*5+7+2-2", {"use_all": True}, 0.0),
        ("3*(5+7-2)-7", {}, 0.0),  # 7 twice
        ("5*3+7", {"format_reward": 0.1}, 1.0),
        ("5*3+2", {"format_reward": 0.1}, 0.1),  # valid, misses
        ("Answer: 3*5+7", {"answer_after": "Answer:"}, 1.0),
    ],
)
def test_countdown_scores(response: str, params: dict[str, object], reward: float) -> None:
    assert score_countdown(response, REF, CountdownParams(**params))[0] == reward


def test_division_is_exact() -> None:
    ref = reference_of([7, 2, 2], 7)
    assert score_countdown("7/2*2", ref, CountdownParams())[0] == 1.0


@pytest.mark.parametrize(
    "response", ["__import__('os')", "3**5", "3 if 5 else 7", "3.5*2", "", "3*", "5//2", "x+1"]
)
def test_anything_but_arithmetic_is_refused_unevaluated(response: str) -> None:
    reward, detail = score_countdown(response, REF, CountdownParams())
    assert reward == 0.0
    assert "invalid" in detail


def test_division_by_zero_is_an_invalid_expression() -> None:
    ref = reference_of([3, 5, 5], 1)
    reward, detail = score_countdown("3/(5-5)", ref, CountdownParams())
    assert reward == 0.0 and detail["invalid"] == "division by zero"


def test_a_bad_reference_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="numbers"):
        score_countdown("1+2", '{"target": 3}', CountdownParams())
