"""CLI error messages carry text from servers and users (job names, file paths, log lines):
they are printed as they are, never read as Rich markup."""

from __future__ import annotations

import pytest
import typer

from cli.common import fail


def test_fail_prints_the_message_as_is_and_exits_with_its_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    message = "No job 'a[/]b': [bold]not markup[/bold] [x]"
    with pytest.raises(typer.Exit) as exited:
        fail(message, code=2)
    assert exited.value.exit_code == 2
    assert message in capsys.readouterr().err
