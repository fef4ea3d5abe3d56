"""One writer per (job, tracker), each through the tracker's own client library, imported only
when a job asks for it (the `trackers` extra installs them).

Logged samples (where a tracker opts in: LOOM_TRACKERS_SAMPLES) become tables: a W&B Table
under `samples`, an MLflow JSON artifact in MLflow's table layout (`columns`, `data`) under
`samples/`, TensorBoard text (a Markdown table per step) under `samples`.

Phases (`sft/loss`, `rl/reward`: see `gateway.jobs.metric_names`) count their own steps. MLflow and
TensorBoard keep a step per metric, so points go in as they are; W&B keeps one step per run, so
each metric is defined against a step metric of its phase (`sft/step`, `rl/step`, or `step`).
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gateway.jobs.metric_names import phase_of
from gateway.schemas import MetricPoint, SampleRecord

SAMPLE_COLUMNS = ("step", "version", "prompt", "completion", "reward")


@dataclass(frozen=True)
class TrackedJob:
    """What a tracker's run is named and tagged with."""

    id: str
    name: str


@dataclass(frozen=True)
class TrackerOptions:
    root: Path  # W&B run directories and TensorBoard event files go under it
    wandb_project: str
    wandb_mode: str
    mlflow_uri: str
    mlflow_experiment: str
    # Where a new MLflow experiment keeps artifacts (the samples' tables); None: the server's
    # default (a local store's default would be ./mlruns of whatever directory Loom ran in).
    mlflow_artifacts: str | None = None
    samples: tuple[str, ...] = ()  # the trackers that also get logged samples, as tables


class Writer(Protocol):
    def log(self, points: Sequence[MetricPoint]) -> None: ...

    def log_samples(self, samples: Sequence[SampleRecord]) -> None: ...

    def close(self) -> None: ...


class WandbWriter:
    def __init__(self, job: TrackedJob, options: TrackerOptions) -> None:
        import wandb

        options.root.mkdir(parents=True, exist_ok=True)  # W&B writes under <dir>/wandb
        self._run = wandb.init(
            project=options.wandb_project,
            mode=options.wandb_mode,
            dir=options.root,
            id=job.id,
            name=f"{job.name} ({job.id})",
            resume="allow",
            reinit="create_new",
            config={"loom_job_id": job.id},
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )
        self._defined: set[str] = set()

    def log(self, points: Sequence[MetricPoint]) -> None:
        rows: dict[tuple[str, int], dict[str, Any]] = {}
        for point in points:
            phase = phase_of(point.name)
            step_key = f"{phase}/step" if phase else "step"
            if point.name not in self._defined:
                self._run.define_metric(point.name, step_metric=step_key)
                self._defined.add(point.name)
            rows.setdefault((step_key, point.step), {step_key: point.step})[point.name] = (
                point.value
            )
        for row in rows.values():
            self._run.log(row)

    def log_samples(self, samples: Sequence[SampleRecord]) -> None:
        import wandb

        self._run.log({"samples": wandb.Table(columns=list(SAMPLE_COLUMNS), data=_rows(samples))})

    def close(self) -> None:
        self._run.finish()


class MlflowWriter:
    def __init__(self, job: TrackedJob, options: TrackerOptions) -> None:
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=options.mlflow_uri)
        experiment = self._client.get_experiment_by_name(options.mlflow_experiment)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self._client.create_experiment(
                options.mlflow_experiment, artifact_location=options.mlflow_artifacts
            )
        )
        found = self._client.search_runs(
            [experiment_id], filter_string=f"tags.loom_job_id = '{job.id}'"
        )
        self.run_id = (
            found[0].info.run_id
            if found
            else self._client.create_run(
                experiment_id, run_name=f"{job.name} ({job.id})", tags={"loom_job_id": job.id}
            ).info.run_id
        )

    def log(self, points: Sequence[MetricPoint]) -> None:
        from mlflow.entities import Metric

        now_ms = int(time.time() * 1000)
        metrics = [Metric(p.name, p.value, now_ms, p.step) for p in points]
        for start in range(0, len(metrics), 1000):  # MLflow's batch limit
            self._client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def log_samples(self, samples: Sequence[SampleRecord]) -> None:
        # One artifact per batch (MLflow's own log_table appends, but needs pandas); the
        # name sorts by step.
        name = f"samples/step_{samples[0].step:012d}_{uuid.uuid4().hex[:8]}.json"
        self._client.log_dict(
            self.run_id, {"columns": list(SAMPLE_COLUMNS), "data": _rows(samples)}, name
        )

    def close(self) -> None:
        return None


class TensorBoardWriter:
    def __init__(self, job: TrackedJob, options: TrackerOptions) -> None:
        from tensorboardX import SummaryWriter

        self._writer = SummaryWriter(logdir=str(options.root / "tensorboard" / job.id))

    def log(self, points: Sequence[MetricPoint]) -> None:
        for point in points:
            self._writer.add_scalar(point.name, point.value, point.step)
        self._writer.flush()

    def log_samples(self, samples: Sequence[SampleRecord]) -> None:
        by_step: defaultdict[int, list[SampleRecord]] = defaultdict(list)
        for sample in samples:
            by_step[sample.step].append(sample)
        for step, logged in sorted(by_step.items()):
            self._writer.add_text("samples", _markdown(logged), step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def _rows(samples: Sequence[SampleRecord]) -> list[list[object]]:
    return [[s.step, s.version, s.prompt, s.completion, s.reward] for s in samples]


def _markdown(samples: Sequence[SampleRecord]) -> str:
    """A Markdown table (TensorBoard's text plugin renders one); cells keep to one line."""

    def cell(value: object) -> str:
        text = "" if value is None else str(value)
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(SAMPLE_COLUMNS) + " |", "|" + " --- |" * len(SAMPLE_COLUMNS)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in _rows(samples)]
    return "\n".join(lines)


WRITERS: dict[str, type[WandbWriter] | type[MlflowWriter] | type[TensorBoardWriter]] = {
    "wandb": WandbWriter,
    "mlflow": MlflowWriter,
    "tensorboard": TensorBoardWriter,
}
