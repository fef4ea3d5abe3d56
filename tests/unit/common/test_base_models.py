"""Base model names: directories as they are, hub names from the local cache, and an unknown
hub name refused at once when the hub is off (no minute of retries)."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import constants

from services.common.base_models import resolve_base_model
from services.common.errors import InvalidInput


def test_directories_and_their_mistakes(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    with pytest.raises(InvalidInput, match="without config.json"):
        resolve_base_model(str(model), tmp_path)
    (model / "config.json").write_text("{}")
    assert resolve_base_model(str(model), tmp_path) == str(model.resolve())
    with pytest.raises(InvalidInput, match="does not exist"):
        resolve_base_model(str(tmp_path / "missing"), tmp_path)
    with pytest.raises(InvalidInput, match="neither a model directory nor a hub model name"):
        resolve_base_model("not a name!", tmp_path)


def test_a_cached_hub_model_resolves_to_its_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "hub"
    snapshot = cache / "models--org--small" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "models--org--small" / "refs").mkdir()
    (cache / "models--org--small" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    assert Path(resolve_base_model("org/small", tmp_path)) == snapshot


def test_an_uncached_hub_model_fails_fast_when_the_hub_is_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    # Refused before any request (the hub client's retries took ~46 s to fail).
    with pytest.raises(InvalidInput, match="not in the local cache .*HF_HUB_OFFLINE=1"):
        resolve_base_model("org/not-downloaded", tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert resolve_base_model("org/not-downloaded", tmp_path) == "org/not-downloaded"
