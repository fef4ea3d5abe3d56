"""Trainer state checkpoints: what a job needs to resume training where it stopped, after the
trainer restarts (or on another trainer that sees the same disk).

`<root>/<job_id>/<name>/` holds `trainable.safetensors` (the trainable weights, by parameter
name), `optimizer.pt` (AdamW's moments, once a step was taken) and `state.json` (step, last
published version, the model spec it came from). A checkpoint is written into a temporary
directory, synced, then renamed into place: a reader sees a whole checkpoint or none. Names
are never reused, so a checkpoint never changes once it exists.

A checkpoint of a series (a managed run's) makes the older ones of its series beyond the
newest `keep` go; the rest stay until deleted or, when they have one, until their expiry
(`expires_at`, the one thing of a checkpoint that may change): from then on an expired
checkpoint is neither listed nor loadable, and its files go when the job's checkpoints are
next listed or any checkpoint is saved. A deletion renames the directory out of sight first,
so a reader never finds half a checkpoint.
"""

from __future__ import annotations

import json
import shutil
import uuid
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file

from services.common.errors import Conflict, InvalidInput, NotFound
from services.common.files import fsync_path
from services.trainer.distributed import dcp_state
from services.trainer.model import TrainerModel
from services.trainer.schemas import StateCheckpoint, TrainingMode

if TYPE_CHECKING:  # a sharded trainer's model, which reloads its checkpoints through here
    from services.trainer.distributed.remote import RemoteModel

WEIGHTS, OPTIMIZER, STATE = "trainable.safetensors", "optimizer.pt", "state.json"
SHARDED = "sharded"  # a sharded trainer's checkpoint: DCP's files (`dcp_state`)


def save_state(
    model: TrainerModel | RemoteModel,
    root: Path,
    name: str,
    series: str | None = None,
    keep: int = 2,
    expires_at: datetime | None = None,
) -> StateCheckpoint:
    drop_expired(root)
    job_dir = root / model.spec.job_id
    final = job_dir / name
    if final.exists():
        raise Conflict(
            f"Job {model.spec.job_id} already has a checkpoint named {name!r}; "
            "checkpoint names are never reused."
        )
    job_dir.mkdir(parents=True, exist_ok=True)
    work = job_dir / f".tmp-{name}-{uuid.uuid4().hex}"
    work.mkdir()
    try:
        has_optimizer = (
            write_checkpoint(model, work)
            if isinstance(model, TrainerModel)
            else model.write_checkpoint(work)
        )
        state = {
            "job_id": model.spec.job_id,
            "name": name,
            "step": model.step,
            "last_version": model.last_version,
            "has_optimizer": has_optimizer,
            "created_at": datetime.now(UTC).isoformat(),
            "series": series,
            "expires_at": None if expires_at is None else expires_at.isoformat(),
            "spec": model.spec.model_dump(mode="json"),
        }
        (work / STATE).write_text(json.dumps(state, indent=2))
        for path in work.rglob("*"):
            fsync_path(path)
        fsync_path(work)
        work.rename(final)
        fsync_path(job_dir)
        if not isinstance(model, TrainerModel):
            model.wrote_checkpoint(final, has_optimizer)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if series is not None:
        same = [c for c in list_states(root, model.spec.job_id) if c.series == series]
        for old in same[:-keep]:
            delete_state(root, model.spec.job_id, old.name)
    return describe(final)


def delete_state(root: Path, job_id: str, name: str) -> StateCheckpoint:
    directory = root / job_id / name
    checkpoint = describe(directory)  # 404 when there is none
    _remove(directory)
    return checkpoint


def _remove(directory: Path) -> None:
    hidden = directory.with_name(f".tmp-deleting-{directory.name}-{uuid.uuid4().hex}")
    directory.rename(hidden)
    shutil.rmtree(hidden, ignore_errors=True)


def set_expiry(root: Path, job_id: str, name: str, expires_at: datetime | None) -> StateCheckpoint:
    """A new expiry (None: never), its state file replaced whole."""
    directory = root / job_id / name
    checkpoint = describe(directory)  # 404 when there is none, or it expired
    state = json.loads((directory / STATE).read_text())
    state["expires_at"] = None if expires_at is None else expires_at.isoformat()
    work = directory / f".{STATE}.{uuid.uuid4().hex}"
    work.write_text(json.dumps(state, indent=2))
    fsync_path(work)
    work.rename(directory / STATE)
    fsync_path(directory)
    return checkpoint.model_copy(update={"expires_at": expires_at})


def drop_expired(root: Path, job_id: str | None = None) -> None:
    """Remove the expired checkpoints of `job_id` (of every job when None)."""
    job_dirs = (
        [root / job_id] if job_id is not None else (list(root.iterdir()) if root.is_dir() else [])
    )
    for job_dir in job_dirs:
        if not job_dir.is_dir():
            continue
        for directory in job_dir.iterdir():
            if (
                directory.is_dir()
                and not directory.name.startswith(".")
                and _expired(_read_state(directory))
            ):
                with suppress(FileNotFoundError):  # removed by another caller meanwhile
                    _remove(directory)


def load_state(
    model: TrainerModel | RemoteModel,
    root: Path,
    name: str,
    job_id: str | None = None,
    optimizer: bool = True,
) -> StateCheckpoint:
    """Put the checkpoint's weights, step and (with `optimizer`) optimizer moments into
    `model`; without `optimizer` the moments are dropped. The checkpoint may be another job's
    (`job_id`) of the same base model, mode and LoRA configuration: parameter names in a
    checkpoint do not depend on the job. Version numbers are a job's own, so a checkpoint of
    another job leaves the model's last published version as it was."""
    source = job_id or model.spec.job_id
    directory = root / source / name
    checkpoint = describe(directory)
    spec = json.loads((directory / STATE).read_text())["spec"]
    where = f"Checkpoint {name!r}" + (f" of job {source}" if source != model.spec.job_id else "")
    if spec["base_model"] != model.spec.base_model:
        raise InvalidInput(
            f"{where} was saved from base model {spec['base_model']!r}; job "
            f"{model.spec.job_id} trains {model.spec.base_model!r}."
        )
    if spec["mode"] != model.spec.mode or (
        model.spec.mode == TrainingMode.lora and spec["lora"] != model.spec.lora.model_dump()
    ):
        raise InvalidInput(
            f"{where} was saved from a {spec['mode']} model with "
            f"LoRA {spec.get('lora')}; job {model.spec.job_id} trains "
            f"{model.spec.mode.value} with LoRA {model.spec.lora.model_dump()}."
        )
    last_version = checkpoint.last_version if source == model.spec.job_id else None
    moments = optimizer and checkpoint.has_optimizer
    if isinstance(model, TrainerModel):
        read_checkpoint(model, directory, moments, checkpoint.step, last_version)
    else:
        model.read_checkpoint(directory, moments, checkpoint.step, last_version)
    return checkpoint


def write_checkpoint(model: TrainerModel, directory: Path) -> bool:
    """The trainable weights and optimizer moments into `directory` (on every rank of a
    sharded model: `SHARDED` through DCP; of a model every rank holds whole: rank 0's files);
    whether there were moments to save."""
    if model.sharded:
        return dcp_state.save(model, directory / SHARDED)
    if model.parallel.rank != 0:
        return model.optimizer() is not None
    save_file(
        {n: p.detach().contiguous().cpu() for n, p in model.named_trainable()}, directory / WEIGHTS
    )
    optimizer = model.optimizer_state()
    if optimizer is not None:
        torch.save(optimizer, directory / OPTIMIZER)
    return optimizer is not None


def read_checkpoint(
    model: TrainerModel, directory: Path, optimizer: bool, step: int, last_version: int | None
) -> None:
    """A checkpoint of either layout, whoever wrote it, into `model` (on every rank of a
    sharded one): see `TrainerModel.restore`."""
    if (directory / SHARDED).is_dir():
        dcp_state.load(model, directory / SHARDED, optimizer)
        model.restore_position(step, last_version)
        return
    weights = load_file(directory / WEIGHTS, device=str(model.device))
    moments = (
        torch.load(directory / OPTIMIZER, weights_only=True, map_location=model.device)
        if optimizer
        else None
    )
    model.restore(weights, moments, step, last_version)


def list_states(root: Path, job_id: str) -> list[StateCheckpoint]:
    drop_expired(root, job_id)
    job_dir = root / job_id
    if not job_dir.is_dir():
        return []
    found = []
    for directory in job_dir.iterdir():
        if directory.is_dir() and not directory.name.startswith("."):
            with suppress(NotFound):  # expired or deleted since
                found.append(describe(directory))
    return sorted(found, key=lambda c: (c.created_at, c.step))


def is_checkpoint(directory: Path) -> bool:
    """Whether `directory` holds a checkpoint that may be loaded (whole, not expired)."""
    state = _read_state(directory)
    return state is not None and not _expired(state)


def describe(directory: Path) -> StateCheckpoint:
    state = _read_state(directory)
    if state is None or _expired(state):
        raise NotFound(
            f"No checkpoint {directory.name!r} for job {directory.parent.name}"
            f"{' (it expired)' if state else ''} (list them with "
            "GET /v1/models/{id}/checkpoints)."
        )
    size = sum(p.stat().st_size for p in directory.iterdir())
    return StateCheckpoint(
        job_id=state["job_id"],
        name=state["name"],
        step=state["step"],
        last_version=state["last_version"],
        has_optimizer=state["has_optimizer"],
        bytes=size,
        created_at=datetime.fromisoformat(state["created_at"]),
        series=state.get("series"),
        expires_at=_expiry(state),
    )


def _read_state(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / STATE).read_text())
    except FileNotFoundError:
        return None


def _expiry(state: dict[str, Any]) -> datetime | None:
    expires_at = state.get("expires_at")
    return None if expires_at is None else datetime.fromisoformat(expires_at)


def _expired(state: dict[str, Any] | None) -> bool:
    expires_at = None if state is None else _expiry(state)
    return expires_at is not None and expires_at <= datetime.now(UTC)
