"""Model files for tests that publish or load versions."""

from __future__ import annotations

from pathlib import Path


def lora_adapter(model_dir: Path, dest: Path, seed: int = 0, rank: int = 4) -> Path:
    """A real PEFT adapter of the tiny model with nonzero B matrices (it changes the weights)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir),
        LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"]),
    )
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    model.save_pretrained(dest)
    return dest
