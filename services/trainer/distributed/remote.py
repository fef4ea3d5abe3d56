"""The coordinator's models when the trainer is sharded: `RemoteRegistry` and `RemoteModel`
stand where `ModelRegistry` and `TrainerModel` stand in one process, and run each operation
on every rank of a `RankGroup` (the operation queue already runs them one at a time, in
submission order).

When a rank fails, the group is formed again and the registry makes its models again on the
new ranks, each reloaded from the last checkpoint it saved or loaded (weights, optimizer
moments, step), or at its base weights where it had none (`Restored`, in the model's info).
The operation in flight fails (`RankFailed`); so does the next operation of every other model,
once, saying where its model is now: no client goes on from a state it no longer has without
being told.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from services.common.base_models import resolve_base_model
from services.trainer import checkpoints
from services.trainer.batch import validate_data
from services.trainer.distributed.ranks import RankFailed, RankGroup, Run
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
    Restored,
)


@dataclass(frozen=True)
class Checkpointed:
    """The last checkpoint a model saved or loaded: what `read_checkpoint` takes to put the
    model back where it was then."""

    directory: Path
    optimizer: bool
    step: int
    last_version: int | None


class RemoteModel:
    def __init__(
        self,
        group: RankGroup,
        spec: CreateModelRequest,
        info: ModelInfo,
        vocab_size: int,
        max_length: int,
    ) -> None:
        self.group = group
        self.spec = spec
        self._info = info
        self.vocab_size = vocab_size
        self.max_length = max_length
        self.step = info.step
        self.last_version = info.last_version
        self.checkpointed: Checkpointed | None = None
        self.restored: Restored | None = None
        self._restored_after: RankFailed | None = None  # the failure `restored` followed
        self._untold = False  # restored, and its client not told yet
        self._unreadable: str | None = None  # a checkpoint a re-forming could not read

    def info(self) -> ModelInfo:
        return self._info.model_copy(
            update={"step": self.step, "restored": self.restored, "last_version": self.last_version}
        )

    def validate(self, data: list[Datum], *, needs_loss: bool) -> None:
        validate_data(data, self.vocab_size, self.max_length, needs_loss=needs_loss)

    def forward_backward(
        self, data: list[Datum], loss_config: LossConfig, return_logprobs: bool = False
    ) -> ForwardBackwardResult:
        result: ForwardBackwardResult = self._call(
            "forward_backward", data, loss_config, return_logprobs
        )
        return result

    def forward(self, data: list[Datum], loss_config: LossConfig | None = None) -> ForwardResult:
        result: ForwardResult = self._call("forward", data, loss_config)
        return result

    def optim_step(self, adam: AdamParams) -> OptimStepResult:
        result: OptimStepResult = self._call("optim_step", adam)
        self.step = result.step
        return result

    def reset_optimizer(self) -> ModelInfo:
        self._call("reset_optimizer")
        return self.info()

    def save(self, directory: Path, shard_bytes: int, reserve: PageReserve | None = None) -> None:
        """Every rank writes its files of the directory (no page reserve: the ranks write)."""
        self._call("save", directory, shard_bytes)

    def write_checkpoint(self, directory: Path) -> bool:
        """Every rank writes its shards (`checkpoints.write_checkpoint`)."""
        has_optimizer: bool = self._call("write_checkpoint", directory, run=True)
        return has_optimizer

    def wrote_checkpoint(self, directory: Path, optimizer: bool) -> None:
        """The checkpoint just written is complete at `directory`: the one to reload."""
        self.checkpointed = Checkpointed(directory, optimizer, self.step, self.last_version)

    def read_checkpoint(
        self, directory: Path, optimizer: bool, step: int, last_version: int | None
    ) -> None:
        """Loading a checkpoint replaces any state a failure rolled back: its client is not
        told of that roll-back any more."""
        self._untold = False
        self._read(
            Checkpointed(directory, optimizer, step, last_version),
            lambda name, *args: self._call(name, *args, run=True),
        )

    def restore(self, run: Run, failure: RankFailed) -> None:
        """On a group formed again after `failure`, where `spec` was made anew (at its base):
        back to the last checkpoint, if it is still there."""
        point = self.checkpointed
        if point is not None and not checkpoints.is_checkpoint(point.directory):
            point = None  # deleted or expired since: the base is all there is
        self.step = 0
        if point is not None:
            try:
                self._read(point, lambda name, *args: run(("run", self.spec.job_id, name, args)))
            except Exception as exc:
                # A checkpoint that cannot be read must not keep the trainer from forming
                # again for every model: this re-forming fails, the next one brings this
                # model back at its base and says why.
                self.checkpointed = None
                self._unreadable = f"{point.directory.name!r} ({exc})"
                raise
        directory = None if point is None else point.directory
        self.restored = Restored(
            at=datetime.now(UTC),
            failed_rank=failure.detail["rank"],
            failed_operation=failure.detail["operation"],
            step=self.step,
            checkpoint=None if directory is None else directory.name,
            checkpoint_job_id=None
            if directory is None or directory.parent.name == self.spec.job_id
            else directory.parent.name,
            unreadable_checkpoint=None if directory is not None else self._unreadable,
        )
        self._unreadable = None
        self._restored_after, self._untold = failure, True

    def _read(self, point: Checkpointed, call: Callable[..., Any]) -> None:
        call("read_checkpoint", point.directory, point.optimizer, point.step, point.last_version)
        self.step = point.step
        if point.last_version is not None:
            self.last_version = point.last_version
        self.checkpointed = point

    def _tell(self) -> None:
        """Run in turn before every operation: the first one after a roll-back this model's
        client did not see fails, saying where the model is now."""
        if not self._untold:
            return
        self._untold = False
        restored = self.restored
        assert restored is not None
        raise RankFailed(
            f"Trainer rank {restored.failed_rank} failed during another operation; the "
            f"trainer restarted its ranks and {self._where()}, training since it is lost. "
            "This operation was not run.",
            {
                "rank": restored.failed_rank,
                "operation": restored.failed_operation,
                "restored": restored.model_dump(mode="json"),
            },
        )

    def _where(self) -> str:
        restored = self.restored
        assert restored is not None
        if restored.checkpoint is None:
            why = (
                ""
                if restored.unreadable_checkpoint is None
                else f" since its checkpoint {restored.unreadable_checkpoint} could not be read"
            )
            return f"model {self.spec.job_id} is back at its base weights (step 0){why}"
        return (
            f"model {self.spec.job_id} is back at its checkpoint {restored.checkpoint!r} "
            f"(step {restored.step})"
        )

    def _call(self, method: str, *args: Any, run: bool = False) -> Any:
        """`method` of the model on every rank (`run`: a function of `rank.FUNCTIONS`); a
        rank failure during it fails it saying where the model is now."""
        try:
            return self.group.call(
                "run" if run else "call", self.spec.job_id, method, args, check=self._tell
            )
        except RankFailed as exc:
            if exc is not self._restored_after:  # not restored after it (yet), or told already
                raise
            assert self.restored is not None
            self._untold = False  # this error tells its client
            raise RankFailed(
                f"{exc.message} Now {self._where()}.",
                {**exc.detail, "restored": self.restored.model_dump(mode="json")},
            ) from None


class RemoteRegistry(Models[RemoteModel]):
    """The models on the ranks."""

    def __init__(self, group: RankGroup) -> None:
        super().__init__()
        self.group = group
        group.on_reform = self._reform
        # The models on the ranks, in the order they were made (LoRA jobs attach to their
        # shared base in that order); one made on the ranks is here before a failure can
        # re-form them.
        self._made: list[RemoteModel] = []

    def _make(self, spec: CreateModelRequest) -> RemoteModel:
        # Resolved here first: a generated base (`loom/tiny`) is built by this process, which
        # has no process group, not by a rank (transformers' save_pretrained writes nothing on
        # a rank other than 0), and a bad name fails before any rank works on it.
        resolve_base_model(spec.base_model, self.group.config.data_dir)
        with self.group.exclusive():
            info, _, vocab_size, max_length = self.group.call("create", spec)
            model = RemoteModel(self.group, spec, info, vocab_size, max_length)
            self._made.append(model)
        return model

    def _reform(self, run: Run, failure: RankFailed) -> None:
        """Every model made again on the new ranks, then reloaded."""
        for model in self._made:
            run(("create", model.spec))
        for model in self._made:
            model.restore(run, failure)
