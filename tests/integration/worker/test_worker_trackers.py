"""Metrics the worker writes itself (an evaluation's, recorded in the transaction that ends its
task) reach the job's trackers as the gateway's do: the worker's sessions are attached to a
tracker mirror chosen by the same LOOM_TRACKERS settings (read back with TensorBoard's own
reader)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gateway.job_logs import log_metrics
from gateway.models import ALEMBIC_DIR, VERSION_TABLE, JobRow
from services.common.db import migrate, transaction
from services.worker.app import create_celery
from services.worker.evaluate import metric_points
from services.worker.schemas import EvaluateResult
from services.worker.settings import WorkerSettings
from tests.conftest import require
from tests.support.tracker_readers import tensorboard_series


def test_an_evaluations_metrics_written_by_the_worker_reach_the_jobs_tracker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require(importlib.util.find_spec("tensorboardX") is not None, "tensorboardX")
    monkeypatch.setenv("LOOM_TRACKERS", "tensorboard")
    monkeypatch.setenv("LOOM_TRACKERS_DIR", str(tmp_path / "trackers"))
    url = f"sqlite:///{tmp_path / 'loom.db'}"
    migrate(url, ALEMBIC_DIR, VERSION_TABLE)
    app = create_celery(WorkerSettings(data_dir=tmp_path / "data", database_url=url))
    result = EvaluateResult(name="held_out", version=3, step=30, count=4, correct=3, errors=0,
                            accuracy=0.75, mean_reward=0.5, metrics=[])
    with transaction(app.sessions) as session:
        session.add(JobRow(id="job_eval", name="evaluated", base_model="loom/tiny",
                           mode="lora", config={}, status="running"))
        session.flush()
        log_metrics(session, "job_eval", metric_points(result))  # as the evaluate task does
    app.close_trackers()
    assert tensorboard_series(tmp_path / "trackers" / "tensorboard" / "job_eval") == {
        "eval/held_out/accuracy": [(30, 0.75)], "eval/held_out/mean_reward": [(30, 0.5)]}
