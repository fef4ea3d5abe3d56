"""save_weights publishes to a real (in-process) model-state store, and what it publishes
loads back: full weights with transformers, the adapter with peft."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import peft
import pytest
import torch
from trainer_harness import JOB_FULL, JOB_LORA, TrainerHarness
from transformers import AutoModelForCausalLM, AutoTokenizer

from modelstate.client import ModelStateClient

TOKENS = torch.tensor([[5, 17, 42, 8, 99, 3]])


async def train_one_step(trainer: TrainerHarness, job_id: str, data: list[dict[str, Any]]) -> None:
    await trainer.run(job_id, "forward_backward", {"data": data})
    await trainer.run(job_id, "optim_step", {"adam": {"lr": 1e-2}})


def page_reserve(parent: Path) -> dict[str, int]:
    """The files of the page reserve under `parent`, once it is filled (in the background)."""
    files: dict[str, int] = {}
    for _ in range(200):
        reserves = list(parent.glob("page-reserve-*"))
        if len(reserves) == 1:
            files = {p.name: p.stat().st_size for p in reserves[0].iterdir()}
            if files and all(files.values()):
                break
        time.sleep(0.05)
    return files


def trained_logits(trainer: TrainerHarness, job_id: str) -> torch.Tensor:
    with trainer.service.registry.get(job_id).network() as network, torch.no_grad():
        network.eval()
        logits: torch.Tensor = network(input_ids=TOKENS).logits
    return logits


async def test_full_weights_load_back_identically(
    trainer: TrainerHarness,
    modelstate_client: ModelStateClient,
    arithmetic_data: list[dict[str, Any]],
) -> None:
    await trainer.create(JOB_FULL, "full")
    await train_one_step(trainer, JOB_FULL, arithmetic_data)
    saved = await trainer.run(
        JOB_FULL, "save_weights", {"aliases": ["best"], "metrics": {"loss": 1.5}}
    )
    assert saved == {"job_id": JOB_FULL, "number": 1, "kind": "full", "step": 1}

    version = await modelstate_client.get_version(JOB_FULL, "best")
    assert version.number == 1 and version.parent == 0 and version.step == 1
    assert version.metrics == {"loss": 1.5} and version.base_model == trainer.base_model
    assert version.local_path is not None
    published = Path(version.local_path)
    names = {f.path for f in version.files}
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    } <= names

    reloaded = AutoModelForCausalLM.from_pretrained(published, dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=TOKENS).logits, trained_logits(trainer, JOB_FULL))
    tokenizer = AutoTokenizer.from_pretrained(published)
    original = AutoTokenizer.from_pretrained(trainer.base_model)
    assert tokenizer("12+34=46")["input_ids"] == original("12+34=46")["input_ids"]
    # Written straight into the store's staging area and adopted there: nothing left over
    # but the page reserve for the next save (files named and sized like its weights).
    staging = published.parents[2] / "staging"
    assert page_reserve(staging) == {
        f.path: f.size for f in version.files if f.path.endswith(".safetensors")
    }
    leftover = sorted(p.name for p in staging.iterdir())
    assert leftover[0] == ".loom-store-id" and leftover[1].startswith("page-reserve-")
    assert len(leftover) == 2
    assert not trainer.service.work_dir.exists()

    info = (await trainer.http.get(f"/v1/models/{JOB_FULL}")).json()
    assert info["last_version"] == 1


async def test_without_the_stores_filesystem_the_trainer_uploads(
    trainer: TrainerHarness,
    modelstate_client: ModelStateClient,
    arithmetic_data: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def elsewhere() -> None:  # as on a trainer host that does not mount the store
        return None

    monkeypatch.setattr(modelstate_client, "staging_dir", elsewhere)
    await trainer.create(JOB_LORA, "lora")
    await train_one_step(trainer, JOB_LORA, arithmetic_data)
    saved = await trainer.run(JOB_LORA, "save_weights", {})
    version = await modelstate_client.get_version(JOB_LORA, saved["number"])
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {f.path for f in version.files}
    # Scratch space cleaned up, but for the page reserve of the next save.
    assert page_reserve(trainer.service.work_dir) == {
        "adapter_model.safetensors": next(
            f.size for f in version.files if f.path == "adapter_model.safetensors"
        )
    }
    (leftover,) = trainer.service.work_dir.iterdir()
    assert leftover.name.startswith("page-reserve-")


async def test_lora_adapter_loads_back_identically(
    trainer: TrainerHarness,
    modelstate_client: ModelStateClient,
    arithmetic_data: list[dict[str, Any]],
) -> None:
    lora = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}
    await trainer.create(JOB_LORA, "lora", lora=lora)
    await train_one_step(trainer, JOB_LORA, arithmetic_data)
    first = await trainer.run(JOB_LORA, "save_weights", {})
    await train_one_step(trainer, JOB_LORA, arithmetic_data)
    second = await trainer.run(JOB_LORA, "save_weights", {})
    assert (first["number"], second["number"], second["step"]) == (1, 2, 2)

    version = await modelstate_client.get_version(JOB_LORA, "latest")
    assert version.number == 2 and version.parent == 1 and version.kind == "lora"
    assert version.local_path is not None
    published = Path(version.local_path)
    adapter_config = json.loads((published / "adapter_config.json").read_text())
    assert adapter_config["r"] == 4 and adapter_config["lora_alpha"] == 8
    assert sorted(adapter_config["target_modules"]) == ["q_proj", "v_proj"]
    assert adapter_config["base_model_name_or_path"] == trainer.base_model
    assert (published / "adapter_model.safetensors").exists()

    base = AutoModelForCausalLM.from_pretrained(trainer.base_model, dtype=torch.float32)
    reloaded = peft.PeftModel.from_pretrained(base, published).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=TOKENS).logits, trained_logits(trainer, JOB_LORA))
