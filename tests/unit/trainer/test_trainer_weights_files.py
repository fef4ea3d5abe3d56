"""The trainer's own Hugging Face writer: what it writes loads back, sharded or not, through
transformers and peft, with tied embeddings saved once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import peft
import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from services.trainer.weights_files import TokenizerFiles, write_adapter, write_full

TOKENS = torch.tensor([[3, 17, 5, 9, 11]])


def load(path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        result: torch.Tensor = model(input_ids=TOKENS).logits
    return result


def perturbed(tiny_model_dir: Path) -> torch.nn.Module:
    """The tiny model with every weight moved, as training would."""
    model = load(tiny_model_dir)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    return model


def saved_names(directory: Path) -> set[str]:
    names: set[str] = set()
    for path in directory.glob("*.safetensors"):
        with safe_open(path, "pt") as weights:
            names |= set(weights.keys())
    return names


def test_full_weights_load_back_identically_with_tied_embeddings_once(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = perturbed(tiny_model_dir)
    write_full(model, tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert not (tmp_path / "model.safetensors.index.json").exists()
    names = saved_names(tmp_path)
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    assert {"config.json", "generation_config.json"} <= {p.name for p in tmp_path.iterdir()}
    assert torch.equal(logits(load(tmp_path)), logits(model))


def test_full_weights_past_the_shard_size_are_sharded_with_an_index(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = perturbed(tiny_model_dir)
    write_full(model, tmp_path, shard_bytes=64 << 10)
    shards = sorted(tmp_path.glob("model-*-of-*.safetensors"))
    assert len(shards) > 2 and not (tmp_path / "model.safetensors").exists()
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {p.name for p in shards}
    assert set(index["weight_map"]) == saved_names(tmp_path)
    saved = {n: t for n, t in model.state_dict().items() if n != "lm_head.weight"}
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in saved.values()
    )
    assert torch.equal(logits(load(tmp_path)), logits(model))


def test_adapter_loads_back_identically_through_peft(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"
    )
    model = peft.get_peft_model(load(tiny_model_dir), config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.add_(0.05 * torch.randn_like(parameter))  # B starts at zero
    write_adapter(model, tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {
        "adapter_model.safetensors",
        "adapter_config.json",
    }
    saved = json.loads((tmp_path / "adapter_config.json").read_text())
    assert saved["inference_mode"] is True and saved["r"] == 4
    assert saved["base_model_name_or_path"] == str(tiny_model_dir)
    assert model.peft_config["default"].inference_mode is False  # the live model is untouched
    reloaded = peft.PeftModel.from_pretrained(load(tiny_model_dir), tmp_path).eval()
    assert torch.equal(logits(reloaded), logits(model.eval()))


def test_tokenizer_files_are_written_the_same_every_time(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    files = TokenizerFiles(str(tiny_model_dir))
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        files.write(tmp_path / name)
    first = {p.name: p.read_bytes() for p in (tmp_path / "first").iterdir()}
    assert "tokenizer_config.json" in first
    assert first == {p.name: p.read_bytes() for p in (tmp_path / "second").iterdir()}
    written = AutoTokenizer.from_pretrained(tmp_path / "second")
    original = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert written("12+34=46")["input_ids"] == original("12+34=46")["input_ids"]


ADAPTER_CONFIG_OF_A_PROCESS = """
import hashlib, sys, tempfile
from pathlib import Path
import torch
from services.trainer.registry import ModelRegistry
from services.trainer.schemas import CreateModelRequest
work = Path(tempfile.mkdtemp())
registry = ModelRegistry(work, torch.device("cpu"))
model, _ = registry.create(CreateModelRequest(job_id="j", base_model=sys.argv[1], mode="lora"))
(work / "out").mkdir()
model.save(work / "out", 1 << 20)
print((work / "out" / "adapter_config.json").read_text())
"""


@pytest.mark.slow  # four subprocesses, each loading torch and peft
def test_an_adapter_is_the_same_bytes_in_every_process(tiny_model_dir: Path) -> None:
    """A trainer restarted after a crash republishes a checkpoint's step: the same adapter
    must be the same files, whatever order the process's string hashes put peft's sets in
    (they differed between processes, and the republish was a conflict)."""
    root = Path(__file__).resolve().parents[3]
    configs = {
        subprocess.run(
            [sys.executable, "-c", ADAPTER_CONFIG_OF_A_PROCESS, str(tiny_model_dir)],
            check=True,
            capture_output=True,
            text=True,
            cwd=root,
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
        ).stdout
        for seed in (1, 2, 3, 4)
    }
    assert len(configs) == 1, configs
    targets = json.loads(configs.pop())["target_modules"]
    assert len(targets) > 1 and targets == sorted(targets)
