"""Tinker's checkpoints on Loom's trainer checkpoints.

Tinker names saved weights by path: `tinker://<model_id>/weights/<name>` for training state
(`save_state`: trainable weights and optimizer moments, a trainer state checkpoint of the
model's job) and `tinker://<model_id>/sampler_weights/<name>` for weights to sample
(`save_weights_for_sampler`: a modelstate version). A model id names a training run; it is
found in the gateway's memory, or after a gateway restart by the job it was made for.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.auth.keys import KeyIdentity
from gateway.compat.tinker import schemas
from gateway.jobs.jobs import visible_to
from gateway.models import ApiKeyRow, JobRow
from gateway.schemas import JobStatus
from services.common.errors import InvalidInput
from services.trainer.schemas import LoraConfig, SaveStateRequest, StateCheckpoint

SCHEME = "tinker://"
WEIGHTS, SAMPLER_WEIGHTS = "weights", "sampler_weights"
KINDS = {WEIGHTS: "training", SAMPLER_WEIGHTS: "sampler"}  # path segment -> checkpoint_type


@dataclass(frozen=True)
class TinkerPath:
    model_id: str
    kind: str  # WEIGHTS or SAMPLER_WEIGHTS
    name: str

    def __str__(self) -> str:
        return f"{SCHEME}{self.model_id}/{self.kind}/{self.name}"

    @property
    def checkpoint_id(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclass(frozen=True)
class TrainingRun:
    """What a Tinker model id stands for: a Loom LoRA job."""

    model_id: str
    job_id: str
    base_model: str  # the name the SDK gave
    lora: LoraConfig


def parse_path(path: str) -> TinkerPath:
    parts = path.removeprefix(SCHEME).split("/") if path.startswith(SCHEME) else []
    if len(parts) != 3 or parts[1] not in KINDS or not parts[0] or not parts[2]:
        raise InvalidInput(
            f"{path!r} is not a Tinker checkpoint path: "
            f"{SCHEME}<model_id>/weights/<name> (save_state) or "
            f"{SCHEME}<model_id>/sampler_weights/<name> (save_weights_for_sampler)."
        )
    return TinkerPath(*parts)


def training_path(path: str) -> TinkerPath:
    """A path that load_state can take: training state, not sampler weights."""
    parsed = parse_path(path)
    if parsed.kind != WEIGHTS:
        raise InvalidInput(
            f"{path!r} holds sampler weights (save_weights_for_sampler), not "
            f"training state: load one saved with save_state "
            f"({SCHEME}<model_id>/weights/<name>)."
        )
    return parsed


def checkpoint_name(name: str | None) -> str:
    """A save_state name Loom's trainer takes (a checkpoint directory of the job)."""
    if name is None:
        raise InvalidInput("save_state needs a name.")
    try:
        return SaveStateRequest(name=name).name
    except ValidationError:
        raise InvalidInput(
            f"Checkpoint name {name!r}: Loom takes 1 to 128 letters, digits, "
            "'.', '_' or '-', starting with a letter or digit."
        ) from None


def lora_for_rank(rank: int) -> LoraConfig:
    """The LoRA of a Tinker training model of this rank (alpha = rank: a scale of 1)."""
    return LoraConfig(rank=rank, alpha=float(rank))


@dataclass(frozen=True)
class RunRecord:
    """A training run as the gateway's database knows it."""

    run: TrainingRun
    owner_name: str
    created_at: datetime
    failed: bool  # its job failed


def run_records(
    session: Session, viewer: KeyIdentity, model_id: str | None = None
) -> list[RunRecord]:
    """The runs `viewer` sees (only `model_id`'s when given), newest first, from the jobs made
    for them: found when the gateway's memory is gone."""
    named = (
        JobRow.name == job_name(model_id)
        if model_id is not None
        else JobRow.name.like(f"{job_name('')}%")
    )
    rows = session.execute(
        select(JobRow, ApiKeyRow.name)
        .outerjoin(ApiKeyRow, ApiKeyRow.id == JobRow.owner_key_id)
        .where(named, visible_to(viewer))
        .order_by(JobRow.created_at.desc())
    )
    found = []
    for row, owner_name in rows:
        run_id = row.config.get("tinker_model_id")
        if isinstance(run_id, str) and row.lora is not None and run_id == (model_id or run_id):
            run = TrainingRun(
                run_id,
                row.id,
                str(row.config.get("tinker_base_model", row.base_model)),
                LoraConfig(**row.lora),
            )
            found.append(
                RunRecord(
                    run, owner_name or "", row.created_at, row.status == JobStatus.failed.value
                )
            )
    return found


def run_of_job(session: Session, model_id: str, viewer: KeyIdentity) -> TrainingRun | None:
    """The run `model_id` names, unless its job failed."""
    return next((r.run for r in run_records(session, viewer, model_id) if not r.failed), None)


def job_name(model_id: str) -> str:
    return f"tinker {model_id}"


def training_checkpoint(model_id: str, state: StateCheckpoint) -> schemas.Checkpoint:
    path = TinkerPath(model_id, WEIGHTS, state.name)
    return checkpoint(path, state.created_at, state.bytes, state.expires_at)


def checkpoint(
    path: TinkerPath, time: datetime, size: int | None = None, expires_at: datetime | None = None
) -> schemas.Checkpoint:
    """One entry of Tinker's checkpoint list."""
    return schemas.Checkpoint(
        checkpoint_id=path.checkpoint_id,
        checkpoint_type=KINDS[path.kind],  # type: ignore[arg-type]
        time=time,
        tinker_path=str(path),
        size_bytes=size,
        expires_at=expires_at,
    )
