"""The deterministic tiny model tests and the demo use: a small Qwen2-style causal LM with a
random init and a byte-level BPE tokenizer trained on the task corpus, saved as a normal
Hugging Face directory (so vLLM, transformers and peft load it like any other model).
"""

from __future__ import annotations

import json
from pathlib import Path

from agents.tasks.arithmetic import EOS, corpus

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
SPECIAL_TOKENS = [EOS, "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]


def build_tokenizer(out_dir: Path) -> int:
    """Train the tokenizer (digits stay single tokens, so arithmetic stays learnable)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
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
        tokenizer_object=tokenizer, eos_token=EOS, pad_token=EOS, unk_token=None,
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fast.save_pretrained(out_dir)
    return len(fast)


def build_tiny_model(out_dir: Path | str, seed: int = 0) -> Path:
    """Write the tiny model to `out_dir` (idempotent: same seed, same bytes)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab_size = build_tokenizer(out)
    from transformers import AutoTokenizer

    eos_id = AutoTokenizer.from_pretrained(out).eos_token_id
    config = Qwen2Config(
        vocab_size=vocab_size, bos_token_id=eos_id, eos_token_id=eos_id,
        torch_dtype="float32", **TINY_CONFIG,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": eos_id, "bos_token_id": eos_id, "do_sample": True})
    )
    return out


def is_tiny_model(path: Path | str) -> bool:
    return (Path(path) / "config.json").exists() and (Path(path) / "tokenizer.json").exists()
