"""Synthetic arithmetic: `a+b=` → the sum. Deterministic train, validation and held-out splits.

The demo's task; the tiny model's tokenizer is trained on its problems with their answers
(`services.common.tiny_model.corpus`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import NamedTuple

from services.common.tiny_model import arithmetic_pairs


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str


class Splits(NamedTuple):
    train: list[Problem]
    validation: list[Problem]  # for choosing a version (early stopping), never for reporting
    held_out: list[Problem]  # touched only to report accuracy


def make_splits(
    max_operand: int = 99, held_out: int = 200, validation: int = 200, seed: int = 0
) -> Splits:
    """All `a+b=` problems up to `max_operand`, shuffled, split three ways without overlap."""
    pairs = arithmetic_pairs(max_operand)
    random.Random(seed).shuffle(pairs)
    problems = [Problem(prompt=f"{a}+{b}=", answer=str(a + b)) for a, b in pairs]
    cut = held_out + validation
    return Splits(problems[cut:], problems[held_out:cut], problems[:held_out])
