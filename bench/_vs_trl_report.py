"""bench/vs_trl.py's tables: per arm, medians over rounds (seconds per step over every step of
every round), ratios to the TRL arm and the issue's targets, each round with the machine's load,
and the per-phase medians."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

BASELINE = "trl"
# Issue 38's targets, as a ratio to TRL: (wall of 30 steps, peak RSS).
TARGETS = {"loom-sync": {"wall_s": 1.3, "rss": 2.5}, "loom-async": {"wall_s": 1.0, "rss": 2.5}}
# Phases set side by side: TRL's name for what Loom's phase does (None: TRL has no such phase).
PHASES = [
    ("sample", "sample"),
    ("score", "score"),
    ("forward_backward", "forward_backward"),
    ("optim", "optim"),
    ("save_publish", None),
    ("wait", None),
    ("train_publish", None),
]


@dataclass
class Run:
    """One arm's run in one round: its record (from the arm's process) and what the bench saw."""

    round: int
    record: dict[str, Any]
    peak_rss: int  # bytes, summed over the arm's processes
    load_before: float
    load_after: float

    @property
    def arm(self) -> str:
        return str(self.record["arm"])


@dataclass
class Summary:
    arm: str
    runs: list[Run] = field(default_factory=list)

    def median(self, metric: str) -> float:
        """The metric's median over the runs (`min_wall_s`: the smallest wall)."""
        if metric == "step_s":
            return statistics.median(s for r in self.runs for s in r.record["step_s"])
        if metric == "rss":
            return statistics.median(r.peak_rss for r in self.runs)
        if metric == "min_wall_s":  # the round least slowed by the machine's other work
            return min(float(r.record["wall_s"]) for r in self.runs)
        return statistics.median(float(r.record[metric]) for r in self.runs)

    def phase(self, name: str) -> float | None:
        values = [v for r in self.runs for v in r.record["phases"].get(name, [])]
        return statistics.median(values) if values else None

    def reward(self, steps: slice) -> float:
        return statistics.mean(v for r in self.runs for v in r.record["rewards"][steps])


def summarize(runs: list[Run]) -> dict[str, Summary]:
    """Runs by arm, in the order the arms first ran."""
    arms: dict[str, Summary] = {}
    for run in runs:
        arms.setdefault(run.arm, Summary(run.arm)).runs.append(run)
    return arms


def ratio(value: float, baseline: float) -> str:
    return f"{value / baseline:.2f}×" if baseline else "-"


def verdict(arm: str, metric: str, value: float, baseline: float) -> str:
    target = TARGETS.get(arm, {}).get(metric)
    if target is None or not baseline:
        return ""
    met = "met" if value / baseline <= target else "**not met**"
    return f" (target ≤ {target}×: {met})"


def main_table(arms: dict[str, Summary]) -> list[str]:
    base = arms.get(BASELINE)
    rows = [
        "| arm | runs | s/step (median) | × TRL | wall, steps (median s) | × TRL | "
        "wall, steps (fastest round, s) | × TRL | held-out acc. before → after (median) | "
        "peak RSS, all processes (median GB) | × TRL |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, s in arms.items():
        cells = [arm, str(len(s.runs))]
        for metric, fmt in (("step_s", "{:.3f}"), ("wall_s", "{:.1f}"), ("min_wall_s", "{:.1f}")):
            value, target = s.median(metric), metric.removeprefix("min_")
            cells += [
                fmt.format(value),
                ratio(value, base.median(metric)) + verdict(arm, target, value, base.median(metric))
                if base
                else "-",
            ]
        cells.append(f"{s.median('accuracy_before'):.1%} → {s.median('accuracy_after'):.1%}")
        rss = s.median("rss")
        cells += [
            f"{rss / 1e9:.2f}",
            ratio(rss, base.median("rss")) + verdict(arm, "rss", rss, base.median("rss"))
            if base
            else "-",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def phase_table(arms: dict[str, Summary]) -> list[str]:
    loom = [a for a in arms if a != BASELINE]
    rows = [
        "| phase (median s) | " + " | ".join([*loom, BASELINE]) + " |",
        "|---|" + "---|" * (len(loom) + 1),
    ]
    for phase, trl_phase in PHASES:
        values = [arms[a].phase(phase) for a in loom]
        base = arms[BASELINE].phase(trl_phase) if trl_phase and BASELINE in arms else None
        if all(v is None for v in values):
            continue
        cells = [_seconds(v) for v in values] + [_seconds(base)]
        rows.append(f"| {phase} | " + " | ".join(cells) + " |")
    return rows


def curve_table(arms: dict[str, Summary]) -> list[str]:
    """Held-out accuracy at each evaluated step: the median over an arm's rounds (and their
    range)."""
    steps = sorted({step for s in arms.values() for r in s.runs for step, _ in _curve(r)})
    if not steps:
        return []
    rows = [
        "| held-out acc. at step | " + " | ".join(map(str, steps)) + " |",
        "|---|" + "---|" * len(steps),
    ]
    for arm, s in arms.items():
        cells = []
        for step in steps:
            values = [acc for r in s.runs for at, acc in _curve(r) if at == step]
            cells.append(
                f"{statistics.median(values):.1%} ({min(values):.1%}-{max(values):.1%})"
                if values
                else "-"
            )
        rows.append(f"| {arm} | " + " | ".join(cells) + " |")
    return rows


def _curve(run: Run) -> list[tuple[int, float]]:
    return [(int(step), float(acc)) for step, acc in run.record.get("curve", [])]


def rounds_table(runs: list[Run]) -> list[str]:
    rows = [
        "| round | arm | load before → after | wall s | s/step (median) | held-out acc. "
        "before → after | train reward, first 5 → last 5 steps | peak RSS GB | "
        "start-up s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        rec = r.record
        first, last = rec["rewards"][:5], rec["rewards"][-5:]
        rows.append(
            f"| {r.round} | {r.arm} | {r.load_before:.1f} → {r.load_after:.1f} | "
            f"{rec['wall_s']:.1f} | {statistics.median(rec['step_s']):.3f} | "
            f"{rec['accuracy_before']:.1%} → {rec['accuracy_after']:.1%} | "
            f"{_mean(first):.3f} → {_mean(last):.3f} | {r.peak_rss / 1e9:.2f} | "
            f"{rec['setup_s']:.1f} |"
        )
    return rows


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}" if value < 0.01 else f"{value:.3f}"


def _mean(values: list[float]) -> float:
    return statistics.mean(values) if values else float("nan")
