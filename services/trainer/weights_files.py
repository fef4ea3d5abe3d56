"""A trained model's files for hand-off, in the Hugging Face layout, written with safetensors.

`save_pretrained` (transformers and peft) does more than write the bytes: a model card, key
conversions, a tokenizer serialized again on every save (measured on a 2.3 MB LoRA adapter:
30–45 ms, against about 14 ms here). Hand-off latency is what the trainer is measured on, so
it writes the same layout itself:

- full weights: `model.safetensors`, or shards `model-0000i-of-0000n.safetensors` with
  `model.safetensors.index.json` past the shard size (the store then hashes and syncs them in
  parallel, and a shard whose tensors did not change is stored once); tied tensors once;
  `config.json`, `generation_config.json` and the tokenizer's files;
- LoRA: `adapter_model.safetensors` and `adapter_config.json`, as peft writes them.

Tensors are written from their own memory: no copy of the weights. Weight files are written
over the job's page reserve where there is one (`page_reserve`).
"""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import peft
import torch
from torch.distributed.tensor import DTensor
from transformers import AutoTokenizer, PreTrainedModel

from services.trainer.page_reserve import PageReserve
from services.trainer.parallel import SingleProcess
from services.trainer.safetensors_inplace import write_file

MiB = 1 << 20
DEFAULT_SHARD_BYTES = 64 * MiB
SAFETENSORS_METADATA = {"format": "pt"}  # what transformers checks when it loads the file
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"


def write_full(
    model: PreTrainedModel,
    directory: Path,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    reserve: PageReserve | None = None,
    parallel: SingleProcess | None = None,
) -> None:
    """Weights (in shards of at most `shard_bytes`), config and generation config.

    A model sharded across ranks (`parallel`) is written one file at a time: every rank
    gathers that file's tensors, one rank writes it (the files go round the ranks), so no
    rank holds more than one file's worth of whole tensors besides its own shards."""
    parallel = parallel or SingleProcess()
    tensors = _untied_state_dict(model)
    shards = _shards(tensors, shard_bytes)
    names = (
        [WEIGHTS_NAME]
        if len(shards) == 1
        else [f"model-{n:05d}-of-{len(shards):05d}.safetensors" for n in range(1, len(shards) + 1)]
    )
    for number, (name, shard) in enumerate(zip(names, shards, strict=True)):
        whole = parallel.gather(shard)
        if parallel.writes(number):
            _write_weights(whole, directory / name, reserve)
        del whole
    if parallel.rank != 0:
        return
    if len(shards) > 1:
        weight_map = {key: name for name, shard in zip(names, shards, strict=True) for key in shard}
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (directory / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    model.config.save_pretrained(directory)
    if model.can_generate() and model.generation_config is not None:
        model.generation_config.save_pretrained(directory)


def write_adapter(
    model: peft.PeftModel,
    directory: Path,
    adapter: str = "default",
    reserve: PageReserve | None = None,
) -> None:
    """One adapter of `model` and its config, laid out as a single-adapter PEFT directory
    (embeddings are never targeted: not saved)."""
    tensors = peft.get_peft_model_state_dict(
        model, adapter_name=adapter, save_embedding_layers=False
    )
    _write_weights(tensors, directory / ADAPTER_WEIGHTS_NAME, reserve)
    # As peft saves it: an adapter on disk is for inference and names the base it was trained
    # on (the directory the base was loaded from).
    config = copy.copy(model.peft_config[adapter])
    config.inference_mode = True
    # peft keeps target_modules (and friends) as sets, which JSON writes in the iteration
    # order of the process's string hashes: the same adapter saved by a restarted trainer
    # must be the same bytes, or republishing its step after a crash is a conflict.
    for name, value in vars(config).items():
        if isinstance(value, set):
            setattr(config, name, sorted(value))
    config.base_model_name_or_path = (
        config.base_model_name_or_path or model.base_model.model.name_or_path
    )
    config.save_pretrained(str(directory))


class TokenizerFiles:
    """The base model's tokenizer files, serialized once through the tokenizer (so a hub base
    works like a local one) and then written from memory on every save."""

    def __init__(self, model_path: str) -> None:
        self.model_path = model_path
        self._files: dict[str, bytes] | None = None

    def write(self, directory: Path) -> None:
        if self._files is None:
            with tempfile.TemporaryDirectory() as scratch:
                AutoTokenizer.from_pretrained(self.model_path).save_pretrained(scratch)
                self._files = {
                    path.name: path.read_bytes()
                    for path in Path(scratch).iterdir()
                    if path.is_file()
                }
        for name, data in self._files.items():
            (directory / name).write_bytes(data)


def _write_weights(
    tensors: dict[str, torch.Tensor], path: Path, reserve: PageReserve | None
) -> None:
    if reserve is not None:
        reserve.claim(path)
    write_file(tensors, path, metadata=SAFETENSORS_METADATA)


def _untied_state_dict(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """Each tensor once: of names sharing storage (tied embeddings), keep the one the model
    does not declare as tied to another, as transformers does (loaders re-tie)."""
    tied = getattr(model, "_tied_weights_keys", None) or []
    tied_names = set(tied.keys() if isinstance(tied, dict) else tied)
    kept: dict[int, str] = {}  # storage → the name it is saved under
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        storage = _local(tensor).untyped_storage().data_ptr()
        first = kept.get(storage)
        if first is not None:
            if first not in tied_names or name in tied_names:
                continue
            del tensors[first]  # `first` is the tied copy: save the tensor under this name
        kept[storage] = name
        tensors[name] = tensor if isinstance(tensor, DTensor) else tensor.contiguous()
    return tensors


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A rank's own part of a sharded tensor (DTensor), or the tensor."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _shards(tensors: dict[str, torch.Tensor], limit: int) -> list[dict[str, torch.Tensor]]:
    """Consecutive groups of at most `limit` bytes (a bigger tensor gets a shard of its own)."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards
