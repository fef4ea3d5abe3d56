"""Trainer checkpoints of a series (a managed run's) keep only the newest few; the others stay
until deleted; a deleted one is gone at once and a load of it is a clear 404."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import torch

from services.common.errors import NotFound
from services.trainer import checkpoints
from services.trainer.registry import ModelRegistry
from services.trainer.schemas import CreateModelRequest, TrainingMode


def test_a_series_keeps_its_newest_checkpoints_and_named_ones_stay(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    registry = ModelRegistry(tmp_path / "data", torch.device("cpu"))
    model, _ = registry.create(
        CreateModelRequest(job_id="j1", base_model=str(tiny_model_dir), mode=TrainingMode.lora)
    )
    root = tmp_path / "checkpoints"
    checkpoints.save_state(model, root, "before-run")  # a named one: no series
    for step in range(1, 6):
        model.step = step
        checkpoints.save_state(model, root, f"task_1-a1-step-{step}", series="task_1", keep=2)
        checkpoints.save_state(model, root, f"task_2-a1-step-{step}", series="task_2", keep=3)
    names = [c.name for c in checkpoints.list_states(root, "j1")]
    assert names == [
        "before-run",
        "task_2-a1-step-3",
        "task_1-a1-step-4",
        "task_2-a1-step-4",
        "task_1-a1-step-5",
        "task_2-a1-step-5",
    ]  # oldest first
    assert sorted(p.name for p in (root / "j1").iterdir()) == sorted(names)  # nothing left over

    deleted = checkpoints.delete_state(root, "j1", "before-run")
    assert (deleted.name, deleted.series) == ("before-run", None)
    with pytest.raises(NotFound, match="No checkpoint 'before-run'"):
        checkpoints.load_state(model, root, "before-run")
    with pytest.raises(NotFound):
        checkpoints.delete_state(root, "j1", "before-run")
    kept = checkpoints.load_state(model, root, "task_1-a1-step-4")
    assert (kept.step, kept.series) == (4, "task_1")


def test_an_expired_checkpoint_is_neither_listed_nor_loadable_and_its_files_go(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    registry = ModelRegistry(tmp_path / "data", torch.device("cpu"))
    model, _ = registry.create(
        CreateModelRequest(job_id="j1", base_model=str(tiny_model_dir), mode=TrainingMode.lora)
    )
    root = tmp_path / "checkpoints"
    now = datetime.now(UTC)
    checkpoints.save_state(model, root, "kept")
    checkpoints.save_state(model, root, "later", expires_at=now + timedelta(hours=1))
    checkpoints.save_state(model, root, "soon", expires_at=now + timedelta(hours=1))
    listed = {c.name: c.expires_at for c in checkpoints.list_states(root, "j1")}
    assert listed == {
        "kept": None,
        "later": now + timedelta(hours=1),
        "soon": now + timedelta(hours=1),
    }
    # A new expiry, in the past: gone at once; a cleared one never expires.
    checkpoints.set_expiry(root, "j1", "soon", now - timedelta(seconds=1))
    assert checkpoints.set_expiry(root, "j1", "later", None).expires_at is None
    with pytest.raises(NotFound, match="it expired"):
        checkpoints.load_state(model, root, "soon")
    assert [c.name for c in checkpoints.list_states(root, "j1")] == ["kept", "later"]
    assert sorted(p.name for p in (root / "j1").iterdir()) == ["kept", "later"]
    with pytest.raises(NotFound):
        checkpoints.set_expiry(root, "j1", "soon", None)
    # Any job's save sweeps every job's expired checkpoints.
    checkpoints.set_expiry(root, "j1", "kept", now - timedelta(seconds=1))
    other, _ = registry.create(
        CreateModelRequest(job_id="j2", base_model=str(tiny_model_dir), mode=TrainingMode.lora)
    )
    checkpoints.save_state(other, root, "first")
    assert sorted(p.name for p in (root / "j1").iterdir()) == ["later"]
