"""One base model in memory for every LoRA job on it: each job is a named adapter of one PEFT
model, with its own optimizer over its own adapter's parameters.

Four LoRA jobs on an 8B base then hold one copy of the 16 GB of base weights, not four. The
active adapter is model-wide state, so each operation switches to its job's adapter under
the host's lock (operations already run one at a time on the trainer's worker thread; the
lock also keeps a new job's adapter from being injected in the middle of another's step).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import peft
import torch
from transformers import PreTrainedModel

from services.common.errors import InvalidInput
from services.trainer.schemas import LoraConfig


def peft_config(lora: LoraConfig) -> peft.LoraConfig:
    """The PEFT configuration of a job's LoRA settings."""
    return peft.LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )


class LoraHost:
    def __init__(self, base: PreTrainedModel, base_model: str) -> None:
        self.base = base
        self.base_model = base_model  # the name jobs used, for messages
        self.base_params = sum(p.numel() for p in base.parameters())  # before any adapter
        self.network: peft.PeftModel | None = None
        self.lock = threading.RLock()

    def attach(
        self, adapter: str, lora: LoraConfig, seed: int
    ) -> list[tuple[str, torch.nn.Parameter]]:
        """Add the job's adapter (random init from its seed only); returns its parameters."""
        config = peft_config(lora)
        # manual_seed seeds every device's generator: fork the base's too, so creating a job
        # leaves the random streams of the jobs already training (dropout) where they were.
        devices = [self.base.device] if self.base.device.type == "cuda" else []
        with self.lock, torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            try:
                if self.network is None:
                    self.network = peft.get_peft_model(self.base, config, adapter_name=adapter)
                else:
                    self.network.add_adapter(adapter, config)
            except ValueError as exc:  # e.g. target modules the model does not have
                raise InvalidInput(f"Cannot apply LoRA to {self.base_model!r}: {exc}") from exc
            return self.parameters_of(adapter)

    def parameters_of(self, adapter: str) -> list[tuple[str, torch.nn.Parameter]]:
        """The adapter's parameters, named as in a single-adapter model (no adapter name), so
        a checkpoint of one job's adapter fits whatever name the adapter has later."""
        assert self.network is not None
        # LoRA weights live in ModuleDicts keyed by adapter: `...lora_A.<adapter>.weight`.
        mine = re.compile(rf"(\.lora_(?:A|B|embedding_A|embedding_B))\.{re.escape(adapter)}\.")
        return [
            (mine.sub(r"\1.", name), p)
            for name, p in self.network.named_parameters()
            if mine.search(name)
        ]

    @contextmanager
    def using(self, adapter: str) -> Iterator[peft.PeftModel]:
        """The network with `adapter` active (and the only one with gradients on)."""
        with self.lock:
            assert self.network is not None
            if self.network.active_adapter != adapter:
                self.network.set_adapter(adapter)
            yield self.network

    @property
    def adapters(self) -> list[str]:
        return [] if self.network is None else list(self.network.peft_config)
