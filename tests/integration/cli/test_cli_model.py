"""`loom model tiny DIR` builds a loadable Hugging Face model directory."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from cli.main import app
from services.common.tiny_model import is_tiny_model


def test_loom_model_tiny(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["model", "tiny", str(tmp_path / "tiny")])
    assert result.exit_code == 0, result.output
    assert is_tiny_model(tmp_path / "tiny")
    assert (tmp_path / "tiny" / "config.json").exists()


def test_unknown_service_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["up", "--data-dir", str(tmp_path), "--only", "nope"])
    assert result.exit_code == 2
    assert "nope" in result.output


def test_status_without_a_gateway_fails_clearly(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["status", "--url", "http://127.0.0.1:9", "--api-key", "loom_x"]
    )
    assert result.exit_code == 1
