"""The trainer's use cases, independent of HTTP: every model operation is validated when it is
submitted, then queued behind the model's earlier operations (strict submission order). A
submission with an idempotency key (`key`: `Resubmittable`) sent again gets its first
operation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from services.common.errors import PayloadTooLarge
from services.common.operations import OperationQueue
from services.common.schemas import Operation
from services.trainer import checkpoints
from services.trainer.distributed.remote import RemoteRegistry
from services.trainer.page_reserve import DEFAULT_MAX_BYTES, PageReserve, remove_leftovers
from services.trainer.publish import ThreadPublisher, save_weights
from services.trainer.registry import ModelRegistry
from services.trainer.schemas import (
    CheckpointExpiry,
    CreateModelRequest,
    Datum,
    ForwardBackwardRequest,
    ForwardRequest,
    LoadStateRequest,
    ModelInfo,
    OptimStepRequest,
    SaveStateRequest,
    SaveWeightsRequest,
    StateCheckpoint,
)
from services.trainer.weights_files import DEFAULT_SHARD_BYTES


@dataclass(frozen=True)
class Resubmittable:
    """A submission's idempotency key and a hash of its request body as sent: the key sent
    again with the same body is the same submission, with another body a conflict."""

    key: str
    fingerprint: str


class TrainerService:
    def __init__(
        self,
        registry: ModelRegistry | RemoteRegistry,
        queue: OperationQueue,
        publisher: ThreadPublisher,
        work_dir: Path,
        shard_bytes: int = DEFAULT_SHARD_BYTES,
        checkpoint_dir: Path | None = None,
        page_reserve_bytes: int = DEFAULT_MAX_BYTES,
        max_request_tokens: int = 1 << 21,
        keep_series_checkpoints: int = 2,
    ) -> None:
        self.registry = registry
        self.queue = queue
        self.publisher = publisher
        self.work_dir = work_dir
        self.shard_bytes = shard_bytes
        self.checkpoint_dir = checkpoint_dir or work_dir / "checkpoints"
        self.page_reserve_bytes = page_reserve_bytes
        self.max_request_tokens = max_request_tokens
        self.keep_series_checkpoints = keep_series_checkpoints
        self._reserves: dict[str, PageReserve] = {}

    def create_model(self, request: CreateModelRequest) -> tuple[ModelInfo, bool]:
        """Loads the base (seconds for a large model): call it off the event loop."""
        model, created = self.registry.create(request)
        return model.info(), created

    def model_info(self, model_id: str) -> ModelInfo:
        return self.registry.get(model_id).info()

    def forward_backward(
        self, model_id: str, request: ForwardBackwardRequest, key: Resubmittable | None = None
    ) -> Operation:
        model = self.registry.get(model_id)
        self._check_size(request.data)
        model.validate(request.data, needs_loss=True)
        return self._submit(
            model_id,
            "forward_backward",
            key,
            lambda: model.forward_backward(request.data, request.loss, request.return_logprobs),
        )

    def forward(
        self, model_id: str, request: ForwardRequest, key: Resubmittable | None = None
    ) -> Operation:
        model = self.registry.get(model_id)
        self._check_size(request.data)
        model.validate(request.data, needs_loss=False)
        return self._submit(
            model_id, "forward", key, lambda: model.forward(request.data, request.loss)
        )

    def _check_size(self, data: list[Datum]) -> None:
        padded = len(data) * max((len(d.input_ids) for d in data), default=0)
        if padded > self.max_request_tokens:
            raise PayloadTooLarge(
                f"This request is {len(data)} rows padded to its longest row: {padded} tokens, "
                f"over the trainer's limit of {self.max_request_tokens} "
                "(LOOM_TRAINER_MAX_REQUEST_TOKENS). Send the batch in several forward_backward "
                "calls: their gradients add up until optim_step.",
                {"padded_tokens": padded, "limit": self.max_request_tokens},
            )

    def optim_step(
        self, model_id: str, request: OptimStepRequest, key: Resubmittable | None = None
    ) -> Operation:
        model = self.registry.get(model_id)
        return self._submit(model_id, "optim_step", key, lambda: model.optim_step(request.adam))

    def reset_optimizer(self, model_id: str, key: Resubmittable | None = None) -> Operation:
        model = self.registry.get(model_id)
        return self._submit(model_id, "reset_optimizer", key, model.reset_optimizer)

    def save_weights(
        self, model_id: str, request: SaveWeightsRequest, key: Resubmittable | None = None
    ) -> Operation:
        model = self.registry.get(model_id)
        reserve = self._reserves.get(model_id)
        if reserve is None:
            reserve = self._reserves[model_id] = PageReserve(self.page_reserve_bytes)
        return self._submit(
            model_id,
            "save_weights",
            key,
            lambda: save_weights(
                model, request, self.publisher, self.work_dir, self.shard_bytes, reserve
            ),
        )

    def release_page_reserves(self) -> None:
        """At start-up and shutdown: reserve files hold disk space (allocated, never
        written), and a killed trainer leaves its own behind."""
        for reserve in self._reserves.values():
            reserve.release()
        remove_leftovers(self.work_dir)

    def save_state(
        self, model_id: str, request: SaveStateRequest, key: Resubmittable | None = None
    ) -> Operation:
        model = self.registry.get(model_id)
        return self._submit(
            model_id,
            "save_state",
            key,
            lambda: checkpoints.save_state(
                model,
                self.checkpoint_dir,
                request.name,
                request.series,
                self.keep_series_checkpoints,
                request.expires_at,
            ),
        )

    def delete_checkpoint(self, model_id: str, name: str) -> StateCheckpoint:
        """At once, not queued: a checkpoint is immutable, and a load of it already queued
        fails cleanly (404) once it is gone."""
        return checkpoints.delete_state(self.checkpoint_dir, model_id, name)

    def set_checkpoint_expiry(
        self, model_id: str, name: str, request: CheckpointExpiry
    ) -> StateCheckpoint:
        return checkpoints.set_expiry(self.checkpoint_dir, model_id, name, request.expires_at)

    def load_state(
        self, model_id: str, request: LoadStateRequest, key: Resubmittable | None = None
    ) -> Operation:
        model = self.registry.get(model_id)
        source = request.job_id or model_id
        checkpoints.describe(self.checkpoint_dir / source / request.name)  # 404 at once
        return self._submit(
            model_id,
            "load_state",
            key,
            lambda: checkpoints.load_state(
                model, self.checkpoint_dir, request.name, source, request.optimizer
            ),
        )

    def checkpoints(self, model_id: str) -> list[StateCheckpoint]:
        """Listed from disk, so a restarted trainer still finds a job's checkpoints."""
        return checkpoints.list_states(self.checkpoint_dir, model_id)

    async def operation(self, op_id: str, wait: float) -> Operation:
        return await self.queue.wait(op_id, wait) if wait > 0 else self.queue.get(op_id)

    def _submit(
        self,
        model_id: str,
        kind: str,
        key: Resubmittable | None,
        body: Callable[[], BaseModel],
    ) -> Operation:
        """Must run on the event loop (the queue schedules its worker there)."""
        return self.queue.submit(
            model_id,
            kind,
            lambda: body().model_dump(mode="json"),
            idempotency_key=None if key is None else key.key,
            fingerprint="" if key is None else key.fingerprint,
        )
