"""Random-init model shapes for benchmarks: their sizes are what their names say, vLLM's CPU
attention can run them, and `parameter_count` matches what `build_random_model` writes."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from services.common.tiny_model import (
    MODEL_SIZES,
    TINY_CONFIG,
    build_random_model,
    build_tokenizer,
    parameter_count,
)

NOMINAL_BYTES = {"1mb": 1e6, "100mb": 100e6, "1gb": 1e9}


@pytest.fixture(scope="module")
def vocab_size(tmp_path_factory: pytest.TempPathFactory) -> int:
    return build_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.mark.parametrize("name", sorted(MODEL_SIZES))
def test_float32_size_is_near_its_name(name: str, vocab_size: int) -> None:
    weights_bytes = 4 * parameter_count(MODEL_SIZES[name], vocab_size)
    assert 0.8 <= weights_bytes / NOMINAL_BYTES[name] <= 1.2


@pytest.mark.parametrize("name", sorted(MODEL_SIZES))
def test_shape_suits_vllm_cpu_attention(name: str) -> None:
    config = MODEL_SIZES[name]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    assert config["hidden_size"] % heads == 0
    assert config["hidden_size"] // heads in (32, 64)
    assert heads % kv_heads == 0
    assert config["tie_word_embeddings"]


@pytest.mark.parametrize("config", [TINY_CONFIG, MODEL_SIZES["1mb"]], ids=["tiny", "1mb"])
def test_parameter_count_matches_the_saved_model(
    config: dict[str, Any], vocab_size: int, tmp_path: Path
) -> None:
    from safetensors import safe_open

    out = build_random_model(tmp_path / "model", config)
    with safe_open(out / "model.safetensors", "pt") as weights:
        saved = sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())  # noqa: SIM118
    assert saved == parameter_count(config, vocab_size)
