"""The `countdown` verifier: is the response an arithmetic expression over the given numbers
(each used at most once, or all exactly once) whose value is the target?

Only numbers, + - * /, unary minus and parentheses are accepted, checked on the syntax tree
before anything is evaluated, and evaluated exactly with fractions (so 7/2*2 is 7)."""

from __future__ import annotations

import ast
import json
import operator
from collections import Counter
from fractions import Fraction

from pydantic import Field, ValidationError

from services.common.schemas import StrictModel

Score = tuple[float, dict[str, object]]
MAX_EXPRESSION_CHARS = 1000
_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


class CountdownParams(StrictModel):
    use_all: bool = Field(default=False, description="Every number must be used.")
    format_reward: float = Field(
        default=0.0, ge=0, le=1, description="Reward of a valid expression that misses."
    )
    answer_after: str | None = Field(
        default=None, max_length=64, description="Score only the text after the last marker."
    )


class CountdownReference(StrictModel):
    numbers: list[int] = Field(min_length=1, max_length=16)
    target: int


def parse_reference(reference: str | None) -> CountdownReference:
    try:
        return CountdownReference.model_validate_json(reference or "")
    except ValidationError as exc:
        raise ValueError(
            'the reference must be JSON {"numbers": [ints], "target": int}: '
            f"{exc.errors()[0]['msg']}"
        ) from exc


def score_countdown(response: str, reference: str | None, params: CountdownParams) -> Score:
    expected = parse_reference(reference)
    text = response.rsplit(params.answer_after, 1)[-1] if params.answer_after else response
    expression = text.strip().split("=")[0].strip()  # "3*7+1 = 22" states its value too
    try:
        value, used = _evaluate(expression)
    except ValueError as exc:
        return 0.0, {"expression": expression, "invalid": str(exc)}
    available = Counter(expected.numbers)
    overused = sorted((Counter(used) - available).elements())
    if overused:
        return 0.0, {"expression": expression, "invalid": f"numbers not available: {overused}"}
    if params.use_all and Counter(used) != available:
        return 0.0, {"expression": expression, "invalid": "not every number was used"}
    hit = value == expected.target
    return (1.0 if hit else params.format_reward), {"expression": expression, "value": str(value)}


def _evaluate(expression: str) -> tuple[Fraction, list[int]]:
    if not expression or len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expected an expression of 1 to {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from exc
    used: list[int] = []
    return _value(tree.body, used), used


def _value(node: ast.expr, used: list[int]) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand, used)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _value(node.left, used), _value(node.right, used)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError(
        f"only integers, + - * / and parentheses are allowed, not {ast.unparse(node)!r}"
    )


def reference_of(numbers: list[int], target: int) -> str:
    """The reference string a countdown task carries."""
    return json.dumps({"numbers": numbers, "target": target})
