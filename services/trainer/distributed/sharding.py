"""`Sharded`: a `TrainerModel`'s share of the work on one rank of a process group, with its
model sharded by FSDP2 (`fully_shard`: parameters, gradients and optimizer state split across
the ranks, whole layers gathered only while they run).

The ranks split each micro-batch's rows (row i goes to rank i mod N) and add up their shares:
gradients by FSDP's reduce-scatter as a sum (divide factor 1), loss, metrics and per-row
logprobs by an all-reduce. Each rank's share already divides by the whole batch's totals
(every rank has the whole batch), so the sum is exactly one process's value and gradient: no
average of per-rank means. LoRA jobs share a base sharded the same way; their adapters are
small and every rank holds them whole: their gradients are summed by an all-reduce at the
optimizer step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor, distribute_tensor

from services.trainer.parallel import M, SingleProcess

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Sharding:
    """How the ranks keep the model: compute precision (master weights, gradient reductions
    and optimizer state stay fp32), activation checkpointing, and whether the shards live in
    CPU memory while GPUs compute (`cpu_offload`: the trainer allows it on CUDA only)."""

    precision: str = "fp32"
    activation_checkpointing: bool = False
    cpu_offload: bool = False


def shard_options(sharding: Sharding, root: bool) -> dict[str, Any]:
    """`fully_shard`'s keyword arguments for a decoder layer or (`root`) the whole model: the
    layers hand each other the compute dtype; the logits leave the model in fp32."""
    dtype = PRECISIONS[sharding.precision]
    options: dict[str, Any] = {
        "mp_policy": MixedPrecisionPolicy(
            param_dtype=dtype,
            reduce_dtype=torch.float32,
            output_dtype=torch.float32 if root else None,
        )
    }
    if sharding.cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy()
    return options


class Sharded(SingleProcess):
    def __init__(self, sharding: Sharding | None = None) -> None:
        self.sharding = sharding or Sharding()
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        # Where this rank's collectives run: NCCL's on the rank's GPU, gloo's on the CPU.
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if dist.get_backend() == "nccl"
            else torch.device("cpu")
        )

    def wrap(self, model: M) -> M:
        """Each decoder layer a unit of its own (gathered while it runs), the rest (embeddings,
        final norm, head) the root's."""
        if self.sharding.activation_checkpointing:
            enable = getattr(model, "gradient_checkpointing_enable", None)
            if enable is not None:
                enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for layer in _decoder_layers(model):
            fully_shard(layer, **shard_options(self.sharding, root=False))
        fully_shard(model, **shard_options(self.sharding, root=True))
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)  # a sum: see the module's docstring
                module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
        return model

    def load(
        self, empty: Callable[[], M], whole: Callable[[torch.device], M], device: torch.device
    ) -> M:
        """Every rank builds the model on the meta device and shards it, allocating only its
        own shards; rank 0 alone reads the whole model (into CPU memory) and hands it round a
        tensor at a time, each rank keeping its shard (`broadcast_from_rank0`): no other rank
        ever holds the whole model. `device` is the rank's own (`self.device`)."""
        with torch.device("meta"):
            model = empty()
        model = self.wrap(model)
        # Offloaded shards must be made in CPU memory (FSDP2 checks); buffers are not
        # offloaded and stay where the layers compute.
        model.to_empty(device="cpu" if self.sharding.cpu_offload else self.device)
        for buffer in model.buffers():
            buffer.data = buffer.data.to(self.device)
        source = whole(torch.device("cpu")) if self.rank == 0 else None
        with torch.no_grad():
            set_model_state_dict(
                model,
                {} if source is None else source.state_dict(),
                options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
            )
            # Buffers outside the state dict (rotary frequencies) came out of the meta device
            # unset: rank 0's, as the loaded model computed them.
            for name, buffer in model.named_buffers():
                if source is not None:
                    buffer.copy_(source.get_buffer(name))
                dist.broadcast(buffer, src=0)
        return model

    def settle(self, model: torch.nn.Module) -> None:
        # The root keeps its weights gathered after a forward (FSDP2's default, for the
        # backward), and reading a state dict frees them on the one rank that reads it (rank
        # 0 writing an adapter): without this the ranks' next gathers would not pair up.
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()

    def share(self, rows: list[int]) -> list[int]:
        return rows[self.rank :: self.world_size]

    def all_finite(self, value: Tensor) -> bool:
        flag = torch.tensor([float(torch.isfinite(value).all())], device=value.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def sum_rows(self, per_row: Tensor) -> Tensor:
        total = per_row.clone()
        dist.all_reduce(total)
        return total

    def sum_values(self, loss: float, metrics: dict[str, float]) -> tuple[float, dict[str, float]]:
        names = sorted(metrics)
        values = torch.tensor(
            [loss] + [metrics[n] for n in names], dtype=torch.float64, device=self.device
        )
        dist.all_reduce(values)
        total = values.tolist()
        return total[0], dict(zip(names, total[1:], strict=True))

    def gather(self, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        return {
            name: t.full_tensor() if isinstance(t, DTensor) else t for name, t in tensors.items()
        }

    def shard_like(self, whole: Tensor, like: Tensor) -> Tensor:
        if not isinstance(like, DTensor):
            return whole
        return distribute_tensor(whole.to(like.device), like.device_mesh, like.placements)

    def writes(self, number: int) -> bool:
        return number % self.world_size == self.rank

    def grad_norm(self, params: list[torch.nn.Parameter], clip: float | None) -> Tensor:
        """As `torch.nn.utils.clip_grad_norm_` computes it, over the ranks' shards. The
        gradient of a parameter every rank holds whole (a LoRA adapter: see `wrap`) is first
        summed across the ranks."""
        shards, whole = [], []
        for param in params:
            if isinstance(param.grad, DTensor):
                shards.append(param.grad.to_local())
            elif param.grad is not None:
                dist.all_reduce(param.grad)
                whole.append(param.grad)
        squares = _squares(shards, self.device)
        dist.all_reduce(squares)
        norm = (squares + _squares(whole, self.device)).sqrt()
        grads = shards + whole
        if clip is not None and grads:
            coefficient = torch.clamp(clip / (norm + 1e-6), max=1.0)
            for grad in grads:
                grad.detach().mul_(coefficient.to(grad.device, grad.dtype))
        return norm


def _squares(grads: list[Tensor], device: torch.device) -> Tensor:
    total = torch.zeros((), dtype=torch.float32, device=device)
    for grad in grads:
        total += grad.detach().float().pow(2).sum().to(device)
    return total


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a Hugging Face causal LM (`model.model.layers` and the like)."""
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 1:
            return list(module)
    return []
