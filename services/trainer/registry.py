"""The trainer's models, by id (the model id is the job id)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import torch

from services.common.base_models import resolve_base_model
from services.common.errors import Conflict, NotFound
from services.trainer.lora_host import LoraHost
from services.trainer.model import (
    TrainerModel,
    empty_causal_lm,
    load_causal_lm,
    micro_batch_budget,
)
from services.trainer.parallel import SingleProcess
from services.trainer.schemas import CreateModelRequest, TrainingMode


def identity(spec: CreateModelRequest) -> tuple[object, ...]:
    """What makes two create requests the same model (LoRA settings mean nothing in full)."""
    lora = spec.lora if spec.mode == TrainingMode.lora else None
    return spec.base_model, spec.mode, lora, spec.seed


class Specified(Protocol):
    spec: CreateModelRequest


M = TypeVar("M", bound=Specified)


class Models(Generic[M]):
    """Models by id (the model id is the job id); `_make` builds a new one."""

    def __init__(self) -> None:
        self._models: dict[str, M] = {}
        # Held while a model loads, so two identical creates build it once.
        self._lock = threading.Lock()

    def create(self, spec: CreateModelRequest) -> tuple[M, bool]:
        """The model and whether it was created now; the same request again is a no-op."""
        with self._lock:
            existing = self._models.get(spec.job_id)
            if existing is not None:
                if identity(existing.spec) != identity(spec):
                    raise Conflict(
                        f"Model {spec.job_id!r} exists with a different configuration",
                        detail={"existing": existing.spec.model_dump(mode="json")},
                    )
                return existing, False
            model = self._models[spec.job_id] = self._make(spec)
            return model, True

    def _make(self, spec: CreateModelRequest) -> M:
        raise NotImplementedError

    def get(self, model_id: str) -> M:
        model = self._models.get(model_id)
        if model is None:
            raise NotFound(f"No model {model_id!r}: create it with POST /v1/models first")
        return model

    def __len__(self) -> int:
        return len(self._models)


class ModelRegistry(Models[TrainerModel]):
    def __init__(
        self,
        data_dir: Path,
        device: torch.device,
        micro_batch_tokens: int | None = None,
        parallel: SingleProcess | None = None,
    ) -> None:
        """`micro_batch_tokens` None: the device's default (`model.micro_batch_budget`);
        `parallel`: the rank this registry's models are on, when they are sharded."""
        super().__init__()
        self._parallel = parallel
        self._data_dir = data_dir
        self._device = device
        self._micro_batch_tokens = micro_batch_budget(device, micro_batch_tokens)
        self._lora_hosts: dict[str, LoraHost] = {}  # by resolved base path: one copy each

    def _make(self, spec: CreateModelRequest) -> TrainerModel:
        path = resolve_base_model(spec.base_model, self._data_dir)
        host = self._lora_host(path, spec.base_model) if spec.mode == TrainingMode.lora else None
        return TrainerModel(
            spec, path, self._device, host, self._micro_batch_tokens, self._parallel
        )

    def _lora_host(self, path: str, name: str) -> LoraHost:
        """On ranks the shared base is sharded as a full model is (each rank holds 1/N of
        it); its adapters are small and every rank holds them whole."""
        host = self._lora_hosts.get(path)
        if host is None:
            parallel = self._parallel or SingleProcess()
            base = parallel.load(
                lambda: empty_causal_lm(path),
                lambda device: load_causal_lm(path, device),
                self._device,
            )
            host = self._lora_hosts[path] = LoraHost(base, name)
        return host
