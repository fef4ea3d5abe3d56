"""The coordinator's models when the trainer is sharded: `RemoteRegistry` and `RemoteModel`
stand where `ModelRegistry` and `TrainerModel` stand in one process, and run each operation
on every rank of a `RankGroup` (the operation queue already runs them one at a time, in
submission order)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.trainer.batch import validate_data
from services.trainer.distributed.ranks import RankGroup
from services.trainer.page_reserve import PageReserve
from services.trainer.registry import Models
from services.trainer.schemas import (
    AdamParams,
    CreateModelRequest,
    Datum,
    ForwardBackwardResult,
    ForwardResult,
    LossConfig,
    ModelInfo,
    OptimStepResult,
)


class RemoteModel:
    def __init__(self, group: RankGroup, spec: CreateModelRequest, info: ModelInfo,
                 vocab_size: int, max_length: int) -> None:
        self.group = group
        self.spec = spec
        self._info = info
        self.vocab_size = vocab_size
        self.max_length = max_length
        self.last_version = info.last_version
        self._set_step(info.step)

    @property
    def step(self) -> int:
        """The ranks' step: 0 once they were formed again (their models are new)."""
        return self._step if self._restarts == self.group.restarts else 0

    def _set_step(self, step: int) -> None:
        self._step, self._restarts = step, self.group.restarts

    def info(self) -> ModelInfo:
        return self._info.model_copy(update={"step": self.step,
                                             "last_version": self.last_version})

    def validate(self, data: list[Datum], *, needs_loss: bool) -> None:
        validate_data(data, self.vocab_size, self.max_length, needs_loss=needs_loss)

    def forward_backward(self, data: list[Datum], loss_config: LossConfig,
                         return_logprobs: bool = False) -> ForwardBackwardResult:
        result: ForwardBackwardResult = self._call("forward_backward", data, loss_config,
                                                   return_logprobs)
        return result

    def forward(self, data: list[Datum], loss_config: LossConfig | None = None
                ) -> ForwardResult:
        result: ForwardResult = self._call("forward", data, loss_config)
        return result

    def optim_step(self, adam: AdamParams) -> OptimStepResult:
        result: OptimStepResult = self._call("optim_step", adam)
        self._set_step(result.step)
        return result

    def reset_optimizer(self) -> ModelInfo:
        self._call("reset_optimizer")
        return self.info()

    def save(self, directory: Path, shard_bytes: int, reserve: PageReserve | None = None) -> None:
        """Every rank writes its files of the directory (no page reserve: the ranks write)."""
        self._call("save", directory, shard_bytes)

    def write_checkpoint(self, directory: Path) -> bool:
        """Every rank writes its shards (`state_files.write_checkpoint`)."""
        has_optimizer: bool = self.group.call("run", self.spec.job_id, "write_checkpoint",
                                              (directory,))
        return has_optimizer

    def read_checkpoint(self, directory: Path, optimizer: bool, step: int,
                        last_version: int | None) -> None:
        self.group.call("run", self.spec.job_id, "read_checkpoint",
                        (directory, optimizer, step, last_version))
        self._set_step(step)
        if last_version is not None:
            self.last_version = last_version

    def _call(self, method: str, *args: Any) -> Any:
        return self.group.call("call", self.spec.job_id, method, args)


class RemoteRegistry(Models[RemoteModel]):
    """The models on the ranks."""

    def __init__(self, group: RankGroup) -> None:
        super().__init__()
        self.group = group

    def _make(self, spec: CreateModelRequest) -> RemoteModel:
        info, _, vocab_size, max_length = self.group.call("create", spec, replay=True)
        return RemoteModel(self.group, spec, info, vocab_size, max_length)
