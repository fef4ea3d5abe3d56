"""bench/trainer_gpu_scale.py on a CPU: its smoke mode runs the GPU run's code end to end on
tiny shapes (so the script a GPU session runs cannot rot), and its LoRA ladder stops at the
first shape that fails or cannot fit."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from bench._forked import FAILED
from bench._qwen import qwen2_shape
from bench.trainer_gpu_scale import FILE, SMOKE, lora_ladder, main, plan_of


def test_smoke_runs_both_parts_and_writes_the_table(tmp_path: Path) -> None:
    text = main(["--smoke", "--out", str(tmp_path)])
    assert (tmp_path / FILE).read_text() == text
    full = [line for line in text.splitlines() if line.startswith(("| hand-written", "| Loom"))]
    assert len(full) == 2 and full[0].endswith("| 1.00x |")
    assert full[1].split("|")[-2].strip().endswith("x")  # Loom's ratio: it ran
    for name in SMOKE:
        assert any(line.startswith(f"| {name} |") and "—" in line for line in text.splitlines())
    assert f"Largest shape whose LoRA training ran: {list(SMOKE)[-1]}." in text


def test_the_ladder_stops_at_the_first_shape_that_fails_or_cannot_fit(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    plan = plan_of(argparse.Namespace(smoke=True, budget_s=120), parser)
    cpu = {"name": "CPU", "memory": None}
    # 3 query heads do not group over 2 key/value heads: the try fails in its child process.
    broken = {"broken": qwen2_shape(96, 192, 1, 3, 2, 256, True), **SMOKE}
    rows = lora_ladder(replace(plan, sizes=broken), tmp_path, cpu)
    assert [row["name"] for row in rows] == ["broken"] and rows[0]["outcome"][0] == FAILED
    # A shape whose fp32 base outgrows any host is not even built.
    huge = {"huge": qwen2_shape(1 << 20, 1 << 20, 64, 1 << 10, 1 << 10, 1 << 20, False), **SMOKE}
    rows = lora_ladder(replace(plan, sizes=huge), tmp_path, cpu)
    assert [row["outcome"][0] for row in rows] == ["not tried"]
    assert "the host has" in rows[0]["outcome"][1]
    late = replace(plan, deadline=time.monotonic() - 1)
    rows = lora_ladder(late, tmp_path, cpu)
    assert rows[0]["outcome"] == ("not tried", "the time budget (--budget-s) was spent")
