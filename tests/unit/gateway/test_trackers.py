"""Choosing trackers: names from LOOM_TRACKERS or a job's config, checked before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.schemas import TRACKER_NAMES, JobCreate, job_trackers, parse_trackers
from gateway.settings import GatewaySettings
from gateway.trackers.writers import WRITERS


def test_every_tracker_name_has_a_writer() -> None:
    assert set(WRITERS) == set(TRACKER_NAMES)


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("wandb,mlflow", ("wandb", "mlflow")),
        (" tensorboard , wandb,", ("tensorboard", "wandb")),
        ("", ()),
        (["mlflow", "mlflow"], ("mlflow",)),
        ([], ()),
    ],
)
def test_tracker_names_parse_from_a_list_or_a_comma_separated_string(
    value: object, names: tuple[str, ...]
) -> None:
    assert parse_trackers(value) == names


@pytest.mark.parametrize("value", ["neptune", ["wandb", "comet"], 3, [1]])
def test_unknown_trackers_are_refused(value: object) -> None:
    with pytest.raises(ValueError, match="trackers"):
        parse_trackers(value)


def test_a_job_config_chooses_its_trackers_or_leaves_the_default() -> None:
    assert job_trackers({}) is None
    assert job_trackers({"trackers": []}) == ()
    assert JobCreate(base_model="m", config={"trackers": ["wandb"]}).config == {
        "trackers": ["wandb"]
    }
    with pytest.raises(ValidationError, match="unknown trackers"):
        JobCreate(base_model="m", config={"trackers": "wandb,neptune"})


def test_loom_trackers_is_checked_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOM_TRACKERS", "wandb,tensorboard")
    assert parse_trackers(GatewaySettings().trackers) == ("wandb", "tensorboard")
    monkeypatch.setenv("LOOM_TRACKERS", "wandb,nope")
    with pytest.raises(ValidationError, match="unknown trackers"):
        GatewaySettings()


def test_samples_go_to_no_tracker_unless_listed_and_artifacts_stay_beside_the_store(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    options = GatewaySettings(data_dir=tmp_path).tracker_options()
    assert options.samples == ()
    assert options.mlflow_artifacts == (tmp_path / "trackers" / "mlflow-artifacts").as_uri()
    monkeypatch.setenv("LOOM_TRACKERS_SAMPLES", "mlflow")
    monkeypatch.setenv("LOOM_TRACKERS_MLFLOW_URI", "http://mlflow:5000")
    options = GatewaySettings(data_dir=tmp_path).tracker_options()
    assert (options.samples, options.mlflow_artifacts) == (("mlflow",), None)  # the server's
    monkeypatch.setenv("LOOM_TRACKERS_SAMPLES", "neptune")
    with pytest.raises(ValidationError, match="unknown trackers"):
        GatewaySettings()
