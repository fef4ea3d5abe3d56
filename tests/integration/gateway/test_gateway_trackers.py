"""A job's metrics mirrored to W&B (offline), MLflow (a local store) and TensorBoard by the real
gateway, read back with each library's own reader; its logged samples as tables too, for the
trackers that opt in (none by default); a tracker that cannot be reached fails nothing, and
/metrics counts it."""

from __future__ import annotations

import importlib.util
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from agents.sdk import AsyncLoomClient
from gateway.app import create_app
from gateway.settings import GatewaySettings
from services.common.ports import free_port
from tests.conftest import require
from tests.support.servers import serve_in_thread
from tests.support.tracker_readers import (
    mlflow_series,
    mlflow_tables,
    tensorboard_series,
    tensorboard_texts,
    wandb_series,
    wandb_tables,
)
from tests.support.trainer import trainer_stand_in

SFT = {"sft/loss": [(step, 2.0 / step) for step in range(1, 7)]}
RL = {
    "rl/reward": [(step, 0.1 * step) for step in range(1, 4)],
    "kl/mean": [(step, 0.01 * step) for step in range(1, 4)],
}
SAMPLES = [
    {"step": 1, "version": 1, "prompt": "2+2=", "completion": "4", "reward": 1.0},
    {"step": 1, "version": 1, "prompt": "a|b", "completion": "two\nlines", "reward": 0.0},
    {"step": 2, "version": None, "prompt": "3+4=", "completion": "8", "reward": None},
]


@pytest.fixture(autouse=True)
def tracker_libraries() -> None:
    require(
        all(importlib.util.find_spec(m) for m in ("wandb", "mlflow", "tensorboardX")),
        "the trackers extra (wandb, mlflow-skinny, tensorboardX)",
    )


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    """SQLite only: what is mirrored does not depend on the database (job_logs is tested on
    both), and each tracker's first use costs seconds."""
    return f"sqlite:///{tmp_path / 'loom.db'}"


def gateway(tmp_path: Path, database_url: str, **trackers: object) -> Iterator[str]:
    settings = GatewaySettings(
        data_dir=tmp_path / "data", database_url=database_url, trainer_url="", **trackers
    )
    with serve_in_thread(trainer_stand_in()) as trainer_url:
        settings = settings.model_copy(update={"trainer_url": trainer_url})
        with serve_in_thread(create_app(settings)) as url:
            yield url


def counted(url: str, metric: str, tracker: str) -> float:
    text = httpx2.get(f"{url}/metrics", timeout=10).text
    found = re.search(rf'^{metric}_total{{tracker="{tracker}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def wait_counted(url: str, metric: str, tracker: str, at_least: float) -> None:
    deadline = time.monotonic() + 120  # MLflow builds its SQLite store on first use
    while counted(url, metric, tracker) < at_least:
        assert time.monotonic() < deadline, f"{metric}{{{tracker}}} < {at_least}"
        time.sleep(0.2)


async def test_metrics_land_in_wandb_mlflow_and_tensorboard_with_their_steps(
    tmp_path: Path, database_url: str
) -> None:
    serving = gateway(tmp_path, database_url, trackers="wandb,mlflow,tensorboard")
    url = next(serving)
    admin_key = (tmp_path / "data" / "admin_key").read_text().strip()
    async with AsyncLoomClient(url, admin_key) as loom:
        job = await loom.create_job("loom/tiny", name="tracked")
        only_tb = await loom.create_job("loom/tiny", config={"trackers": ["tensorboard"]})
        untracked = await loom.create_job("loom/tiny", config={"trackers": []})
        for phase in (SFT, RL):
            for step in sorted({s for points in phase.values() for s, _ in points}):
                values = {name: dict(points)[step] for name, points in phase.items()}
                for tracked in (job, only_tb, untracked):
                    await tracked.log_metrics(step, values)
        await job.log_metrics(2, {"sft/loss": 0.75})  # a re-sent step replaces its value
        with pytest.raises(Exception, match="unknown trackers"):
            await loom.create_job("loom/tiny", config={"trackers": ["neptune"]})
        await only_tb.log_samples(SAMPLES)  # no tracker takes samples by default
    points = sum(len(p) for p in (*SFT.values(), *RL.values())) + 1
    for tracker in ("wandb", "mlflow"):
        wait_counted(url, "loom_tracker_points", tracker, points)
    wait_counted(url, "loom_tracker_points", "tensorboard", 2 * points - 1)
    assert counted(url, "loom_tracker_failures", "mlflow") == 0
    next(serving, None)  # stops the gateway: writers are closed, W&B runs finished

    expected = {**SFT, **RL}
    resent = {**expected, "sft/loss": [*SFT["sft/loss"], (2, 0.75)]}  # every point written
    replaced = {**expected, "sft/loss": [(s, 0.75 if s == 2 else v) for s, v in SFT["sft/loss"]]}
    root = tmp_path / "data" / "trackers"
    assert _approx(tensorboard_series(root / "tensorboard" / job.id), sort=True) == _approx(
        resent, sort=True
    )
    assert _approx(tensorboard_series(root / "tensorboard" / only_tb.id)) == _approx(expected)
    assert tensorboard_texts(root / "tensorboard" / only_tb.id, "samples") == []
    assert not (root / "tensorboard" / untracked.id).exists()
    assert _approx(mlflow_series(f"sqlite:///{root / 'mlflow.db'}", job.id), sort=True) == (
        _approx(resent, sort=True)
    )
    assert _approx(wandb_series(root / "wandb", job.id), last=True) == _approx(replaced)
    assert not list((root / "wandb").glob(f"*{only_tb.id}*"))


async def test_samples_land_as_tables_in_the_trackers_that_opt_in(
    tmp_path: Path, database_url: str
) -> None:
    serving = gateway(
        tmp_path,
        database_url,
        trackers="wandb,mlflow,tensorboard",
        trackers_samples="wandb,mlflow,tensorboard",
    )
    url = next(serving)
    admin_key = (tmp_path / "data" / "admin_key").read_text().strip()
    async with AsyncLoomClient(url, admin_key) as loom:
        job = await loom.create_job("loom/tiny", name="sampled")
        await job.log_metrics(1, {"rl/reward": 0.5})
        await job.log_samples(SAMPLES[:2])
        await job.log_samples(SAMPLES[2:])
    for tracker in ("wandb", "mlflow", "tensorboard"):
        wait_counted(url, "loom_tracker_points", tracker, 1 + len(SAMPLES))
    next(serving, None)  # writers closed, W&B runs finished

    root = tmp_path / "data" / "trackers"
    assert wandb_tables(root / "wandb", job.id, "samples") == SAMPLES
    assert wandb_series(root / "wandb", job.id) == {"rl/reward": [(1, 0.5)]}  # tables aside
    assert (
        mlflow_tables(f"sqlite:///{root / 'mlflow.db'}", job.id, "samples", tmp_path / "downloaded")
        == SAMPLES
    )
    assert (root / "mlflow-artifacts").is_dir()  # beside the store, not in the working dir
    texts = tensorboard_texts(root / "tensorboard" / job.id, "samples")
    assert [step for step, _ in texts] == [1, 2]
    header, rule, *rows = texts[0][1].splitlines()
    assert header == "| step | version | prompt | completion | reward |"
    assert rows == ["| 1 | 1 | 2+2= | 4 | 1.0 |", "| 1 | 1 | a\\|b | two<br>lines | 0.0 |"]
    assert texts[1][1].splitlines()[2:] == ["| 2 |  | 3+4= | 8 |  |"]


async def test_an_unreachable_tracker_fails_nothing_and_is_counted(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    nowhere = f"http://127.0.0.1:{free_port()}"
    serving = gateway(
        tmp_path, database_url, trackers="mlflow", trackers_mlflow_uri=nowhere, trackers_retries=1
    )
    url = next(serving)
    admin_key = (tmp_path / "data" / "admin_key").read_text().strip()
    async with AsyncLoomClient(url, admin_key) as loom:
        job = await loom.create_job("loom/tiny", name="tracker-down")
        for step in range(1, 21):
            await job.log_metrics(step, {"rl/reward": step / 20})
        assert (await job.metrics())["rl/reward"].steps == list(range(1, 21))
        assert (await loom.get_job(job.id)).info.status == "running"
    wait_counted(url, "loom_tracker_failures", "mlflow", 2)  # the first try and its retry
    wait_counted(url, "loom_tracker_dropped_points", "mlflow", 1)
    assert counted(url, "loom_tracker_points", "mlflow") == 0
    next(serving, None)


def _approx(
    series: dict[str, list[tuple[int, float]]], *, last: bool = False, sort: bool = False
) -> dict[str, list[tuple[int, float]]]:
    """Values rounded to float32 precision (TensorBoard stores float32); `last`: one value
    per step, the last written (trackers that append keep a re-sent step twice)."""
    out = {}
    for name, points in series.items():
        rounded = [(s, round(v, 5)) for s, v in points]
        if last:
            rounded = sorted(dict(rounded).items())
        out[name] = sorted(rounded) if sort else rounded
    return out
