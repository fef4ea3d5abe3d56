"""A sharded model's checkpoint through `torch.distributed.checkpoint` (DCP): every rank
writes the shards it owns of the trainable weights and AdamW's moments (no rank gathers the
model), keyed by parameter name, with the metadata DCP needs to read them back at any world
size: on N ranks, or in one process with no process group (a trainer of world size 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from services.trainer.model import TrainerModel
from services.trainer.schemas import AdamParams

MODEL, OPTIMIZER = "model", "optimizer"
OPTIONS = StateDictOptions(ignore_frozen_params=True)


def save(model: TrainerModel, directory: Path) -> bool:
    """Every rank at once; whether the optimizer's moments were saved."""
    with model.network() as network:
        state: dict[str, Any] = {MODEL: get_model_state_dict(network, options=OPTIONS)}
        optimizer = model.optimizer()
        if optimizer is not None:
            state[OPTIMIZER] = get_optimizer_state_dict(network, optimizer, options=OPTIONS)
        dcp.save(state, checkpoint_id=directory)
    return optimizer is not None


def load(model: TrainerModel, directory: Path, optimizer: bool) -> None:
    """Every rank at once (or one process): weights and, with `optimizer`, the moments, into
    the model's own layout; pending gradients dropped, a fresh optimizer without them."""
    model.reset_optimizer()
    with model.network() as network:
        state: dict[str, Any] = {MODEL: get_model_state_dict(network, options=OPTIONS)}
        adam = model.optimizer_for(AdamParams()) if optimizer else None
        if adam is not None:
            state[OPTIMIZER] = get_optimizer_state_dict(network, adam, options=OPTIONS)
        with torch.no_grad():
            dcp.load(state, checkpoint_id=directory)
            set_model_state_dict(network, state[MODEL], options=OPTIONS)
            if adam is not None:
                set_optimizer_state_dict(network, adam, state[OPTIMIZER], options=OPTIONS)
    for param in model.params:
        param.grad = None
