"""How a `TrainerModel` shares its work with other processes: not at all in one process
(`SingleProcess`, the default), or across the ranks of a process group
(`services.trainer.distributed.sharding.Sharded`).

Every rank receives the whole batch and the same micro-batches (so the batch's loss
normalisers, its `Totals`, are the whole batch's on every rank) and runs its own rows of each
micro-batch; the ranks then add up their shares of the loss, metrics and gradients. A
micro-batch with no row for a rank still runs one stand-in row there with no weight, so every
rank runs the same passes and their collectives pair up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor

M = TypeVar("M", bound=torch.nn.Module)


class SingleProcess:
    """One process holds the whole model and runs every row."""

    world_size = 1
    rank = 0

    def wrap(self, model: M) -> M:
        """The model as the ranks train it (sharded across them, in their precision)."""
        return model

    def load(
        self, empty: Callable[[], M], whole: Callable[[torch.device], M], device: torch.device
    ) -> M:
        """The model as the ranks train it, with the weights `whole` reads (from disk, onto a
        device); `empty` builds the same model without reading any (on the meta device, it
        allocates nothing), for ranks that need only their shards. One process reads it whole
        onto `device`."""
        return self.wrap(whole(device))

    def settle(self, model: torch.nn.Module) -> None:
        """After an operation: the model in the state every rank leaves it in, whatever a
        single rank did with it (on ranks: every layer's gathered weights freed)."""

    def share(self, rows: list[int]) -> list[int]:
        """This rank's rows of a micro-batch."""
        return rows

    def all_finite(self, value: Tensor) -> bool:
        """Whether `value` is finite on every rank (they must all take the same branch)."""
        return bool(torch.isfinite(value))

    def sum_rows(self, per_row: Tensor) -> Tensor:
        """[B, T] values each rank filled for its own rows (zeros elsewhere) -> every row's."""
        return per_row

    def sum_values(self, loss: float, metrics: dict[str, float]) -> tuple[float, dict[str, float]]:
        """This rank's shares of the loss and metrics -> the batch's."""
        return loss, metrics

    def gather(self, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        """Whole tensors of the parameters' shards (every rank takes part)."""
        return tensors

    def shard_like(self, whole: Tensor, like: Tensor) -> Tensor:
        """This rank's part of `whole`, laid out as the parameter `like` is."""
        return whole

    def writes(self, number: int) -> bool:
        """Whether this rank writes the `number`th file of weights being saved."""
        return True

    def grad_norm(self, params: list[torch.nn.Parameter], clip: float | None) -> Tensor:
        """The gradients' total 2-norm over every rank, after clipping them to `clip`."""
        if clip is not None:
            return torch.nn.utils.clip_grad_norm_(params, clip)
        return torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
