"""The deterministic tiny model tests and the demo use: a small Qwen2-style causal LM with a
random init and a byte-level BPE tokenizer trained on its corpus (every `a+b=` sum the demo's
arithmetic task asks, `agents/datasets/arithmetic.py`), saved as a normal Hugging Face directory
(so vLLM, transformers and peft load it like any other model). Part of the service kit: every
service resolves `loom/tiny` (`base_models`), so the model and its corpus sit below them all.

`build_random_model` writes the same kind of model in any shape; `MODEL_SIZES` names the
shapes the benchmarks use (about 1 MB, 100 MB and 1 GB of float32 weights).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EOS = "<|endoftext|>"

TINY_CONFIG = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,  # head_dim 32: vLLM's CPU attention rejects 16
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
# Named random-init shapes for benchmarks. vLLM's CPU attention takes head_dim 32 or 64;
# num_key_value_heads divides num_attention_heads; embeddings tied, like the tiny model.
MODEL_SIZES: dict[str, dict[str, Any]] = {
    "1mb": {
        **TINY_CONFIG,
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    },  # head_dim 32
    "100mb": {
        **TINY_CONFIG,
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
    },
    "1gb": {
        **TINY_CONFIG,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 20,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
    },
}
SPECIAL_TOKENS = [EOS, "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
# ChatML, with tools named in a system turn and tool results in a user turn, as Qwen does
# (a tiny model cannot use the long tool descriptions real templates carry).
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\ntools: "
    "{{ tools | map(attribute='function') | map(attribute='name') | join(', ') }}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] or '' }}"
    "{% for call in m['tool_calls'] or [] %}{% if m['content'] or not loop.first %}\n{% endif %}"
    '<tool_call>\n{"name": "{{ call[\'function\'][\'name\'] }}", "arguments": '
    "{{ call['function']['arguments'] | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Bumped whenever the recipe changes what is written, so cached copies are rebuilt.
RECIPE_VERSION = 3
RECIPE_FILE = "loom-tiny-recipe.json"


def arithmetic_pairs(max_operand: int = 99) -> list[tuple[int, int]]:
    """Every operand pair of the arithmetic task, in a fixed order."""
    return [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]


def corpus(max_operand: int = 99) -> list[str]:
    """Text the tokenizer learns from: every problem with its answer."""
    return [f"{a}+{b}={a + b}{EOS}" for a, b in arithmetic_pairs(max_operand)]


def build_tokenizer(out_dir: Path) -> int:
    """Train the tokenizer (digits stay single tokens, so arithmetic stays learnable)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS,
        pad_token=EOS,
        unk_token=None,
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return len(fast)


def build_tiny_model(out_dir: Path | str, seed: int = 0) -> Path:
    """Write the tiny model to `out_dir` (idempotent: same seed, same bytes)."""
    return build_random_model(out_dir, TINY_CONFIG, seed)


def build_random_model(out_dir: Path | str, config: dict[str, Any], seed: int = 0) -> Path:
    """A Qwen2-style model of shape `config` (Qwen2Config fields), random init from `seed`,
    float32, with the tiny model's tokenizer, as a Hugging Face directory."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab_size = build_tokenizer(out)
    eos_id = AutoTokenizer.from_pretrained(out).eos_token_id
    qwen2_config = Qwen2Config(
        vocab_size=vocab_size,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        dtype="float32",
        **config,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(qwen2_config)
    model.save_pretrained(out, safe_serialization=True)
    if not (out / "config.json").is_file():
        # transformers writes nothing on a torch.distributed rank other than 0: never mark a
        # directory without its model as built.
        raise RuntimeError(f"the tiny model's files were not written to {out} (a rank > 0?)")
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": eos_id, "bos_token_id": eos_id, "do_sample": True})
    )
    (out / RECIPE_FILE).write_text(json.dumps({"version": RECIPE_VERSION}))
    return out


def parameter_count(config: dict[str, Any], vocab_size: int) -> int:
    """Parameters of a Qwen2 model of shape `config` (as saved: tied embeddings once).
    `build_tokenizer` returns the vocabulary size (at most 512; fewer merges are learnt)."""
    hidden: int = config["hidden_size"]
    layers: int = config["num_hidden_layers"]
    head_dim = hidden // config["num_attention_heads"]
    kv: int = config["num_key_value_heads"] * head_dim
    attention = 2 * hidden * hidden + hidden + 2 * (hidden * kv + kv)  # q,o; biases on q,k,v
    mlp: int = 3 * hidden * config["intermediate_size"]
    per_layer = attention + mlp + 2 * hidden  # two RMSNorms
    embeddings = vocab_size * hidden * (1 if config.get("tie_word_embeddings") else 2)
    return embeddings + layers * per_layer + hidden  # final norm


def is_tiny_model(path: Path | str) -> bool:
    """A complete tiny model written by the current recipe."""
    recipe = Path(path) / RECIPE_FILE
    try:
        recipe_written: object = json.loads(recipe.read_text())
        return recipe_written == {"version": RECIPE_VERSION}
    except (OSError, ValueError):
        return False
