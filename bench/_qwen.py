"""Qwen2.5 shapes for the GPU benchmarks, from the models' public config.json files (hidden
size, layers, attention and key/value heads, MLP width, vocabulary, tied embeddings), and a
random-init model of one built locally: nothing is downloaded. Rope and norm settings are
transformers' Qwen2Config defaults (they change no shape and no cost)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from services.common.tiny_model import parameter_count


def qwen2_shape(
    hidden: int, mlp: int, layers: int, heads: int, kv_heads: int, vocab: int, tied: bool
) -> dict[str, Any]:
    """Qwen2Config fields of a shape."""
    return {
        "hidden_size": hidden,
        "intermediate_size": mlp,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "max_position_embeddings": 32768,
    }


# Ascending by size (the order benchmarks try them in).
QWEN25: dict[str, dict[str, Any]] = {
    "0.5B": qwen2_shape(896, 4864, 24, 14, 2, 151936, True),
    "1.5B": qwen2_shape(1536, 8960, 28, 12, 2, 151936, True),
    "3B": qwen2_shape(2048, 11008, 36, 16, 2, 151936, True),
    "7B": qwen2_shape(3584, 18944, 28, 28, 4, 152064, False),
    "14B": qwen2_shape(5120, 13824, 48, 40, 8, 152064, False),
    "32B": qwen2_shape(5120, 27648, 64, 40, 8, 152064, False),
    "72B": qwen2_shape(8192, 29568, 80, 64, 8, 152064, False),
}


def parameters(shape: dict[str, Any]) -> int:
    """Parameters of a model of `shape` (tied embeddings counted once)."""
    return parameter_count(shape, shape["vocab_size"])


def build_qwen(
    shape: dict[str, Any], directory: Path, device: str, dtype: torch.dtype = torch.float32
) -> int:
    """A random-init model of `shape`, made on `device` (a GPU initialises billions of
    weights in a second) and saved to `directory` in `dtype`; returns its parameter count."""
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(Qwen2Config(**shape), dtype=dtype)
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())
