"""The full-weights check reads safetensors headers only: the tiny model's own files pass,
anything else is named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from services.common.errors import InvalidInput
from services.rollout.weights_check import check_loadable, tensor_specs


def test_the_models_own_weights_pass_and_others_are_named(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    served = tensor_specs(tiny_model_dir)
    assert served["model.embed_tokens.weight"][1] == 128
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(tiny_model_dir / "model.safetensors", copy)
    check_loadable(copy, served, "v1")
    half = tmp_path / "half"
    half.mkdir()
    save_file({"model.norm.weight": torch.ones(128)}, half / "model.safetensors")
    with pytest.raises(InvalidInput, match="v2 lacks tensors of the served model"):
        check_loadable(half, served, "v2")
    (half / "model.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    with pytest.raises(InvalidInput, match="its header claims"):
        check_loadable(half, served, "v3")
    (half / "model.safetensors").write_bytes((20).to_bytes(8, "little") + b"not json" * 3)
    with pytest.raises(InvalidInput, match="does not parse"):
        check_loadable(half, served, "v4")
    with pytest.raises(InvalidInput, match="no .safetensors files"):
        tensor_specs(tmp_path / "empty")
