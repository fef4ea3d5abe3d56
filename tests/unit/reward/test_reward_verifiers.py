"""Verifiers as plain functions, and the registry's validation of names and params."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidInput
from services.reward.schemas import ScoreItem
from services.reward.verifiers import (
    ExactMatchParams,
    FirstIntegerParams,
    MathParams,
    RegexParams,
    answer_after,
    first_integer,
    resolve,
    score_exact_match,
    score_first_integer,
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
def test_exact_match(
    response: str, reference: str, params: dict[str, object], reward: float
) -> None:
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
    params = RegexParams(pattern=r"\d+", mode=mode)
    assert score_regex(response, None, params, 1.0)[0] == reward


def test_a_regex_that_backtracks_for_ever_stops_at_its_deadline() -> None:
    params = RegexParams(pattern="(a|aa)+$")
    with pytest.raises(TimeoutError):
        score_regex("a" * 60 + "b", None, params, 0.2)


@pytest.mark.parametrize(
    ("text", "integer"),
    [
        ("42", 42),
        ("The answer is 42.", 42),
        ("57\n12+3", 57),
        ("  -7 apples", -7),
        ("+7", 7),
        ("3-5", 3),
        ("x = -12", -12),
        ("1,234 people", 1234),
        ("-12,345,678", -12345678),
        ("1,23", 1),
        ("12345,678", 12345),
        ("3.5", None),
        ("1,234.5", None),
        ("no digits", None),
        ("", None),
        ("٤٢", None),
        ("007", 7),
    ],
)
def test_first_integer_edge_cases(text: str, integer: int | None) -> None:
    assert first_integer(text) == integer


@pytest.mark.parametrize(
    ("response", "reference", "params", "reward"),
    [
        ("57", "57", {}, 1.0),
        ("57 and then 3", "57", {}, 1.0),
        ("=57", " 57 ", {}, 1.0),
        ("5 7", "57", {}, 0.0),
        ("the sum is 1,000", "1000", {}, 1.0),
        ("", "57", {}, 0.0),
        ("3 steps... #### 57", "57", {"answer_after": "####"}, 1.0),
        ("3 steps, no marker", "3", {"answer_after": "####"}, 1.0),
    ],
)
def test_first_integer_verifier(
    response: str, reference: str, params: dict[str, object], reward: float
) -> None:
    params_model = FirstIntegerParams(**params)
    assert score_first_integer(response, reference, params_model)[0] == reward


def test_first_integer_needs_an_integer_reference() -> None:
    with pytest.raises(ValueError, match="holds no integer"):
        score_first_integer("3", "three", FirstIntegerParams())


def test_unknown_verifier_lists_the_known_ones() -> None:
    with pytest.raises(
        InvalidInput, match="code, countdown, exact_match, first_integer, math, python, regex"
    ):
        resolve("nope", {}, [ScoreItem(response="x")])


def test_invalid_regex_is_invalid_input_with_the_regex_error() -> None:
    with pytest.raises(InvalidInput, match="invalid regular expression: missing \\)"):
        resolve("regex", {"pattern": "(a"}, [ScoreItem(response="x")])


@pytest.mark.parametrize(
    ("verifier", "params"),
    [
        ("exact_match", {"case_sensitive": "maybe"}),
        ("exact_match", {"colour": "blue"}),
        ("regex", {}),
        ("regex", {"pattern": "a", "mode": "sometimes"}),
    ],
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
    assert set(listed) == {
        "exact_match",
        "first_integer",
        "math",
        "regex",
        "code",
        "python",
        "countdown",
    }
    assert set(listed["regex"].params) == {"pattern", "mode"}
    assert all(v.description for v in listed.values())
