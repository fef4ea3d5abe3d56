"""bench/vs_trl.py's pure parts: the process-tree RSS sampler and the tables."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from bench._rss import PeakRss, tree_rss
from bench._vs_trl_report import Run, main_table, phase_table, rounds_table, summarize

HOLD = (
    "import sys, time; b = bytearray(int(sys.argv[1])); b[::4096] = b'x' * len(b[::4096]); "
    "print('ready', flush=True); time.sleep(60)"
)


def hold_memory(mib: int) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(mib << 20)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def test_tree_rss_counts_a_child_process_once_and_its_memory() -> None:
    child = hold_memory(64)
    try:
        alone = psutil.Process(os.getpid()).memory_info().rss
        both = tree_rss([os.getpid()])
        assert both - alone >= 64 << 20  # the child's touched pages
        # Named again as a root, the child is not counted twice (that would add 64 MiB).
        assert abs(tree_rss([os.getpid(), child.pid]) - both) < 16 << 20
    finally:
        child.kill()
        child.wait()


def test_peak_rss_keeps_the_largest_sum_and_counts_processes_started_inside() -> None:
    children: list[subprocess.Popen[str]] = []
    with PeakRss(lambda: [c.pid for c in children], interval_s=0.01) as peak:
        children.append(hold_memory(48))
        time.sleep(0.1)
        children[0].kill()
        children[0].wait()
        time.sleep(0.05)
    assert peak.peak >= 48 << 20
    assert tree_rss([c.pid for c in children]) == 0  # gone: it counts as nothing
    assert peak.samples >= 2


def record(arm: str, step: float) -> dict[str, object]:
    return {
        "arm": arm,
        "wall_s": step * 30,
        "step_s": [step] * 30,
        "phases": {"sample": [step / 2], "score": [0.001], "forward_backward": [step / 3]}
        | ({"save_publish": [0.04]} if arm != "trl" else {}),
        "accuracy_before": 0.4,
        "accuracy_after": 0.5,
        "rewards": [0.3] * 30,
        "setup_s": 5.0,
    }


def test_tables_give_ratios_to_trl_and_say_whether_each_target_is_met() -> None:
    runs = [
        Run(1, record("trl", 0.2), 700_000_000, 1.0, 1.5),
        Run(1, record("loom-sync", 0.3), 2_000_000_000, 1.5, 2.0),
        Run(2, record("loom-sync", 0.24), 1_500_000_000, 1.5, 2.0),
        Run(2, record("trl", 0.2), 700_000_000, 1.0, 1.5),
    ]
    arms = summarize(runs)
    assert list(arms) == ["trl", "loom-sync"]
    table = "\n".join(main_table(arms))
    loom_row = next(line for line in table.splitlines() if line.startswith("| loom-sync"))
    # s/step: the median over every step (30 of 0.3, 30 of 0.24), no target; wall: the
    # median of the rounds' 9.0 and 7.2 s
    assert "| 0.270 | 1.35× |" in loom_row
    assert (
        "| 8.1 | 1.35× (target ≤ 1.3×: **not met**) | 7.2 | 1.20× (target ≤ 1.3×: met) |"
        in loom_row
    )
    assert "| 1.75 | 2.50× (target ≤ 2.5×: met) |" in loom_row
    phases = "\n".join(phase_table(arms))
    assert "| save_publish | 0.040 | - |" in phases  # TRL has no such phase
    assert "| score | 0.0010 | 0.0010 |" in phases
    assert "wait" not in phases  # no arm has it
    assert len(rounds_table(runs)) == 2 + len(runs)
