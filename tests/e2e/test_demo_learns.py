"""The demo job, end to end on the real stack: GRPO improves held-out accuracy over SFT."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from agents.examples.arith_grpo import DemoConfig, run_demo

pytestmark = pytest.mark.e2e


def test_grpo_improves_held_out_accuracy(stack, tmp_path: Path) -> None:
    url, key, _ = stack
    result = run_demo(url, key, tmp_path, DemoConfig())

    assert result.accuracy_after > result.accuracy_before
    versions = [point["version"] for point in result.curve]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    assert result.png_path is not None and result.png_path.stat().st_size > 1000
    assert result.csv_path is not None
    with result.csv_path.open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == DemoConfig().rl_steps
