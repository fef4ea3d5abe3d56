"""Every verifier in one registry: name → description, parameters and scoring function.

A verifier turns (response, reference, params) into a reward in [0, 1] and a small detail dict.
Where it runs (`runs_in`):
- `inline`: in the service's event loop, a batch at a time: cheap, bounded work (microseconds
  an item), where any hop to another thread or process would cost more than the verifier.
- `thread`: a batch at a time on a thread of the scorer's, off the event loop, for trusted code
  that bounds its own time (`timeout_s`): regular expressions run on the `regex` engine, whose
  matching stops at a deadline (Python's `re` cannot be interrupted, so it needed a process
  that could be killed: one process hop per item made 8 items cost ~2 ms and 16 groups at once
  ~17 ms each, queued behind two workers) and releases the GIL while it matches.
- `worker`: the worker pool (see `workers.py`): math-verify times itself out with
  `signal.alarm`, which needs a main thread (scoring functions are module-level so workers can
  run them).
- `sandbox`: verifiers that run code, through the sandbox service (see `sandboxed.py`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import regex
from pydantic import Field, ValidationError, field_validator

from services.common.errors import InvalidInput, invalid_options
from services.common.schemas import StrictModel
from services.reward.countdown import CountdownParams, score_countdown
from services.reward.sandboxed import CodeParams, PythonParams, score_code, score_python
from services.reward.schemas import ScoreItem, VerifierInfo, VerifierList

Score = tuple[float, dict[str, Any]]


def answer_after(text: str, marker: str | None) -> str:
    """The text after the last `marker` (e.g. "####" in GSM8K, "Answer:"), or all of it."""
    if not marker or marker not in text:
        return text
    return text.rsplit(marker, 1)[1]


def normalize_whitespace(text: str) -> str:
    return " ".join(text.split())


# --- exact_match -------------------------------------------------------------------------------


class ExactMatchParams(StrictModel):
    case_sensitive: bool = Field(default=True, description="Compare letter case too.")
    answer_after: str | None = Field(
        default=None, description="Compare only the response text after the last such marker."
    )


def score_exact_match(response: str, reference: str | None, params: ExactMatchParams) -> Score:
    answer = normalize_whitespace(answer_after(response, params.answer_after))
    expected = normalize_whitespace(reference or "")
    if not params.case_sensitive:
        answer, expected = answer.casefold(), expected.casefold()
    return float(answer == expected), {"answer": answer}


# --- first_integer -----------------------------------------------------------------------------

# An optional sign right before the digits, then either digits with thousands commas (1,234 and
# -12,345,678: groups of exactly three) or plain digits; ASCII digits only.
FIRST_NUMBER = re.compile(r"([-+]?)(\d{1,3}(?:,\d{3})+(?!\d)|\d+)(\.\d+)?", re.ASCII)


class FirstIntegerParams(StrictModel):
    answer_after: str | None = Field(
        default=None, description='Read the integer after the last such marker ("####").'
    )


def first_integer(text: str) -> int | None:
    """The first number in `text` when it is an integer, else None.

    "The answer is 42." → 42; "-7" → -7 and "+7" → 7 (a sign right before the digits, so
    "3-5" → 3); "1,234" → 1234 but "1,23" → 1 (commas only as thousands separators); "3.5"
    → None (the first number is not an integer: no later integer is taken instead) while
    "42." → 42; "٤٢" (non-ASCII digits) is no number."""
    match = FIRST_NUMBER.search(text)
    if match is None or match.group(3):
        return None
    return int(match.group(1) + match.group(2).replace(",", ""))


def score_first_integer(response: str, reference: str | None, params: FirstIntegerParams) -> Score:
    expected = first_integer(reference or "")
    if expected is None:
        raise ValueError(f"the reference {reference!r} holds no integer")
    answer = first_integer(answer_after(response, params.answer_after))
    return float(answer == expected), {"answer": answer}


# --- math --------------------------------------------------------------------------------------


class MathParams(StrictModel):
    pass


def score_math(response: str, reference: str | None, _params: MathParams) -> Score:
    from math_verify import parse, verify  # imported here: ~1 s of sympy, paid by workers

    gold = parse(reference or "")
    if not gold:
        raise ValueError(f"the reference {reference!r} holds no mathematical answer")
    answer = parse(response)
    detail = {
        "reference_parsed": str(gold[0]),
        "response_parsed": str(answer[0]) if answer else None,
    }
    return float(bool(answer) and verify(gold, answer)), detail


# --- regex -------------------------------------------------------------------------------------


class RegexParams(StrictModel):
    pattern: str = Field(max_length=10_000, description="A Python regular expression.")
    mode: Literal["search", "fullmatch"] = Field(
        default="search", description="search: anywhere in the response; fullmatch: all of it."
    )

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            regex.compile(pattern)
        except regex.error as exc:
            raise ValueError(f"invalid regular expression: {exc}") from exc
        return pattern


def score_regex(
    response: str, _reference: str | None, params: RegexParams, timeout_s: float
) -> Score:
    """Raises TimeoutError past `timeout_s` (a pattern that backtracks for ever)."""
    compiled = regex.compile(params.pattern)  # cached by the regex module
    find = compiled.search if params.mode == "search" else compiled.fullmatch
    match = find(response, concurrent=True, timeout=timeout_s)
    return float(match is not None), {"match": match.group(0) if match else None}


# --- registry ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verifier:
    name: str
    description: str
    params_model: type[StrictModel]
    # inline/worker: (response, reference, params) -> Score;
    # thread: (response, reference, params, timeout_s) -> Score;
    # sandbox: async (run_in_sandbox, response, reference, params) -> Score
    score: Callable[..., Any]
    needs_reference: bool
    runs_in: Literal["inline", "thread", "worker", "sandbox"]

    def info(self) -> VerifierInfo:
        params = {
            name: field.description or "" for name, field in self.params_model.model_fields.items()
        }
        return VerifierInfo(name=self.name, description=self.description, params=params)


VERIFIERS: dict[str, Verifier] = {
    verifier.name: verifier
    for verifier in (
        Verifier(
            "exact_match",
            "1.0 when the response equals the reference, whitespace normalised.",
            ExactMatchParams,
            score_exact_match,
            needs_reference=True,
            runs_in="inline",
        ),
        Verifier(
            "first_integer",
            "1.0 when the first integer in the response equals the "
            "reference's (signs, thousands commas; a decimal first number scores 0).",
            FirstIntegerParams,
            score_first_integer,
            needs_reference=True,
            runs_in="inline",
        ),
        Verifier(
            "math",
            "1.0 when the response's final answer is mathematically equivalent to "
            "the reference (math-verify: LaTeX, \\boxed{}, fractions, decimals, equations).",
            MathParams,
            score_math,
            needs_reference=True,
            runs_in="worker",
        ),
        Verifier(
            "regex",
            "1.0 when the pattern matches the response.",
            RegexParams,
            score_regex,
            needs_reference=False,
            runs_in="thread",
        ),
        Verifier(
            "countdown",
            "1.0 when the response is an expression over the reference's "
            "numbers (each at most once; + - * / and parentheses) equal to its target; "
            'reference: JSON {"numbers": [...], "target": n}.',
            CountdownParams,
            score_countdown,
            needs_reference=True,
            runs_in="inline",
        ),
        Verifier(
            "code",
            "Fraction of tests the response's program passes, each top-level "
            "assert of the tests (the reference, or params.tests) run in the sandbox.",
            CodeParams,
            score_code,
            needs_reference=False,
            runs_in="sandbox",
        ),
        Verifier(
            "python",
            "A reward function of the job's own (params.code defines "
            "reward(response, reference)), run in the sandbox for each item.",
            PythonParams,
            score_python,
            needs_reference=False,
            runs_in="sandbox",
        ),
    )
}


def verifier_list() -> VerifierList:
    return VerifierList(verifiers=[verifier.info() for verifier in VERIFIERS.values()])


def resolve(name: str, params: dict[str, Any], items: list[ScoreItem]) -> tuple[Verifier, Any]:
    """The verifier and its validated parameters; a clear `InvalidInput` for anything wrong."""
    verifier = VERIFIERS.get(name)
    if verifier is None:
        known = sorted(VERIFIERS)
        raise InvalidInput(
            f"Unknown verifier {name!r}; known verifiers: {', '.join(known)}", {"known": known}
        )
    try:
        parsed = verifier.params_model.model_validate(params)
    except ValidationError as exc:
        raise invalid_options(exc, f"Invalid params for verifier {name!r}", "params") from exc
    needs_reference = verifier.needs_reference or (
        isinstance(parsed, CodeParams) and parsed.tests is None
    )
    if needs_reference:
        missing = [i for i, item in enumerate(items) if item.reference is None]
        if missing:
            raise InvalidInput(
                f"Verifier {name!r} needs a reference; items without one: {missing[:20]}",
                {"items": missing},
            )
    return verifier, parsed


def run_verifier(name: str, response: str, reference: str | None, params: Any) -> Score:
    """Entry point for pool workers: look the verifier up by name (functions pickle by name)."""
    return VERIFIERS[name].score(response, reference, params)


def warm_up() -> None:
    """Pool initializer: pay math-verify's import and first-parse cost before the first item."""
    score_math("1/2", "0.5", MathParams())
