"""What a metric's name says: the phase of a run it belongs to and the panel it is drawn in.

A name `phase/metric` belongs to a phase (`sft/loss`, `rl/reward`, `eval/accuracy`) unless its
prefix is itself a panel word (`kl/mean`, `throughput/samples_per_s` stay unphased). Phases run
one after another and each counts its own steps.
"""

from __future__ import annotations

import re

# (panel title, what its names contain). Checked in order: `reward_loss` counts as reward.
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Reward", ("reward", "return", "accuracy", "score")),
    ("Loss", ("loss",)),
    ("KL", ("kl",)),
    ("Throughput", ("throughput", "per_s", "per_sec", "tokens_s", "samples_s", "per_second")),
)
_WORD = re.compile(r"[^a-z0-9]+")

# Phases in the order a run goes through them; any other phase follows, by name.
PHASE_ORDER = ("", "pretrain", "sft", "rl", "eval")


def panel_of(name: str) -> str | None:
    lowered = name.lower()
    words = set(_WORD.split(lowered))
    for title, needles in PANELS:
        for needle in needles:
            # Short needles must be a whole word ("kl" in "kl/mean", not in "weekly").
            if (needle in words) if len(needle) <= 3 else (needle in lowered):
                return title
    return None


def phase_of(name: str) -> str:
    """The phase a metric name belongs to ("" for none)."""
    prefix, slash, rest = name.partition("/")
    return prefix if slash and rest and panel_of(prefix) is None else ""
