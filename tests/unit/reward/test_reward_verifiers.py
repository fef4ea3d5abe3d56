"""Verifiers as plain functions, and the registry's validation of names and params."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidInput
from services.reward.schemas import ScoreItem
from services.reward.verifiers import (
    ExactMatchParams,
    MathParams,
    RegexParams,
    answer_after,
    resolve,
    score_exact_match,
    score_math,
    score_regex,
    verifier_list,
)


@pytest.mark.parametrize(
    ("response", "reference", "params", "reward"),
    [
        ("  Paris \n", "Paris", {}, 1.0),
        ("New   York\tCity", "New York City", {}, 1.0),
        ("paris", "Paris", {}, 0.0),
        ("paris", "Paris", {"case_sensitive": False}, 1.0),
        ("Let me think... #### 42", "42", {"answer_after": "####"}, 1.0),
        ("no marker 42", "42", {"answer_after": "####"}, 0.0),
    ],
)
def test_exact_match(response: str, reference: str, params: dict[str, object],
                     reward: float) -> None:
    assert score_exact_match(response, reference, ExactMatchParams(**params))[0] == reward


def test_answer_after_takes_the_last_marker() -> None:
    assert answer_after("a: 1, a: 2", "a:") == " 2"
    assert answer_after("no marker", "a:") == "no marker"


@pytest.mark.parametrize(
    ("response", "reference", "reward"),
    [
        ("1/2", "0.5", 1.0),
        ("0.5", "\\frac{1}{2}", 1.0),
        ("The answer is $\\frac{1}{2}$.", "1/2", 1.0),
        ("x=3", "3", 1.0),
        ("so \\boxed{3}", "3", 1.0),
        ("the answer is 4", "3", 0.0),
    ],
)
def test_math_equivalence(response: str, reference: str, reward: float) -> None:
    assert score_math(response, reference, MathParams())[0] == reward


def test_math_garbage_response_scores_zero_without_error() -> None:
    reward, detail = score_math("blah blah, no idea", "3", MathParams())
    assert reward == 0.0 and detail["response_parsed"] is None


def test_math_reference_without_an_answer_is_an_error() -> None:
    with pytest.raises(ValueError, match="holds no mathematical answer"):
        score_math("3", "no math here", MathParams())


@pytest.mark.parametrize(
    ("response", "mode", "reward"),
    [("answer: 42", "search", 1.0), ("answer: 42", "fullmatch", 0.0), ("42", "fullmatch", 1.0)],
)
def test_regex(response: str, mode: str, reward: float) -> None:
    assert score_regex(response, None, RegexParams(pattern=r"\d+", mode=mode))[0] == reward


def test_unknown_verifier_lists_the_known_ones() -> None:
    with pytest.raises(InvalidInput, match="code, countdown, exact_match, math, python, regex"):
        resolve("nope", {}, [ScoreItem(response="x")])


def test_invalid_regex_is_invalid_input_with_the_regex_error() -> None:
    with pytest.raises(InvalidInput, match="missing \\), unterminated subpattern"):
        resolve("regex", {"pattern": "(a"}, [ScoreItem(response="x")])


@pytest.mark.parametrize(
    ("verifier", "params"),
    [("exact_match", {"case_sensitive": "maybe"}), ("exact_match", {"colour": "blue"}),
     ("regex", {}), ("regex", {"pattern": "a", "mode": "sometimes"})],
)
def test_bad_params_are_invalid_input(verifier: str, params: dict[str, object]) -> None:
    with pytest.raises(InvalidInput, match=f"Invalid params for verifier '{verifier}'"):
        resolve(verifier, params, [ScoreItem(response="x", reference="x")])


def test_missing_reference_is_invalid_input() -> None:
    items = [ScoreItem(response="1", reference="1"), ScoreItem(response="2")]
    with pytest.raises(InvalidInput, match=r"needs a reference; items without one: \[1\]"):
        resolve("math", {}, items)


def test_every_verifier_is_listed_with_its_params() -> None:
    listed = {v.name: v for v in verifier_list().verifiers}
    assert set(listed) == {"exact_match", "math", "regex", "code", "python", "countdown"}
    assert set(listed["regex"].params) == {"pattern", "mode"}
    assert all(v.description for v in listed.values())
