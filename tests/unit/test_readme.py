"""The README is part of the product: its configuration table and quickstart stay true."""

from __future__ import annotations

import re
from pathlib import Path

from cli.settings_doc import settings_markdown

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_configuration_table_lists_every_setting_as_the_code_defines_it() -> None:
    assert settings_markdown() in README, "README is stale: paste the output of `loom config`"


def test_quickstart_has_exactly_two_commands_and_ci_runs_the_test_one() -> None:
    quickstart = README.split("## Quickstart", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in quickstart.strip().splitlines()]
    assert commands == ["make demo", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^exec make test$", ci, re.MULTILINE)
