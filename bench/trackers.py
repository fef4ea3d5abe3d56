"""What mirroring to experiment trackers costs the request that logs metrics: the gateway's
own write path (`job_logs.log_metrics` in a transaction, as `POST /v1/jobs/{id}/metrics` runs
it) with no trackers, with W&B (offline), MLflow (SQLite store) and TensorBoard all mirroring,
and with MLflow pointed at an address where nothing listens. The trackers' own work runs on
their lanes' threads in the same process, so what it takes from the request path (the GIL, the
cores) shows up here. Writes bench/results/trackers.md.

    .venv/bin/python -m bench.trackers [--requests 300] [--points 8]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry
from sqlalchemy.orm import Session, sessionmaker

from gateway.jobs import logs as job_logs
from gateway.models import ALEMBIC_DIR, VERSION_TABLE, JobRow
from gateway.schemas import MetricPoint
from gateway.settings import GatewaySettings
from gateway.trackers.mirror import TrackerMirror, attach
from services.common.db import make_engine, make_sessionmaker, migrate, transaction
from services.common.ports import free_port

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "trackers.md"
ARMS = {
    "none": {},
    "wandb+mlflow+tensorboard": {"trackers": "wandb,mlflow,tensorboard"},
    "mlflow unreachable": {"trackers": "mlflow", "trackers_retries": 3},
}


@dataclass
class Arm:
    sessions: sessionmaker[Session]
    mirror: TrackerMirror
    registry: CollectorRegistry
    job_id: str
    latencies: list[float] = field(default_factory=list)

    def log(self, step: int, points: int) -> None:
        batch = [
            MetricPoint(step=step, name=f"rl/metric_{i}", value=step / (i + 1))
            for i in range(points)
        ]
        started = time.perf_counter()
        with transaction(self.sessions) as session:
            job_logs.log_metrics(session, self.job_id, batch)
        self.latencies.append(time.perf_counter() - started)


COUNTERS = (
    "loom_tracker_points_total",
    "loom_tracker_failures_total",
    "loom_tracker_dropped_points_total",
)


def _total(registry: CollectorRegistry, name: str) -> float:
    """A counter summed over its trackers."""
    return sum(
        sample.value
        for metric in registry.collect()
        for sample in metric.samples
        if sample.name == name
    )


def make_arm(work: Path, name: str, options: dict[str, object]) -> Arm:
    data_dir = Path(tempfile.mkdtemp(dir=work, prefix="arm-"))
    if name == "mlflow unreachable":
        options = {**options, "trackers_mlflow_uri": f"http://127.0.0.1:{free_port()}"}
    settings = GatewaySettings(data_dir=data_dir, **options)
    url = f"sqlite:///{data_dir / 'gw.db'}"
    migrate(url, ALEMBIC_DIR, VERSION_TABLE)
    sessions = make_sessionmaker(make_engine(url))
    registry = CollectorRegistry()
    mirror = TrackerMirror(
        [n for n in settings.trackers.split(",") if n],
        settings.tracker_options(),
        registry,
        retries=settings.trackers_retries,
    )
    attach(sessions, mirror)
    with transaction(sessions) as session:
        row = JobRow(name="bench", base_model="loom/tiny", mode="full", config={}, status="running")
        session.add(row)
        session.flush()
        job_id = row.id
    return Arm(sessions, mirror, registry, job_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--points", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        arms = {name: make_arm(Path(work), name, options) for name, options in ARMS.items()}
        order = list(arms.values())
        for step in range(1, args.requests + 1):  # interleaved, so drift hits every arm
            for arm in order[step % len(order) :] + order[: step % len(order)]:
                arm.log(step, args.points)
        for arm in order:
            arm.mirror.close(timeout_s=30)
        results = {name: arm.latencies for name, arm in arms.items()}
        counts = {
            name: [_total(arm.registry, metric) for metric in COUNTERS]
            for name, arm in arms.items()
        }
    base = statistics.median(results["none"])
    lines = [
        "# Trackers: cost to the request that logs metrics",
        "",
        f"`python -m bench.trackers --requests {args.requests} --points {args.points}`, "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; `job_logs.log_metrics` in its own transaction "
        "(SQLite), as the metrics route runs it; arms take turns request by request, and all "
        "trackers' lanes work on threads of the same process. The machine is shared with "
        "other work: compare ratios within this run.",
        "",
        "| arm | median ms | p95 ms | median / none | points delivered | failed tries | "
        "points dropped |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, values in results.items():
        values = sorted(values)
        p95 = values[int(0.95 * (len(values) - 1))]
        median = statistics.median(values)
        lines.append(
            f"| {name} | {median * 1000:.2f} | {p95 * 1000:.2f} | "
            f"{median / base:.2f} | " + " | ".join(f"{c:.0f}" for c in counts[name]) + " |"
        )
    text = "\n".join(lines) + "\n"
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
