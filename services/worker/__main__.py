"""`python -m services.worker`: a Celery worker consuming Loom's queue, LOOM_WORKER_CONCURRENCY
tasks at a time, with Celery beat inside it when a schedule is on (LOOM_WORKER_GC_INTERVAL_S)."""

from __future__ import annotations

import os
from typing import Any

from celery import signals

from services.common.logs import configure_logging
from services.common.tracing import flush_spans, tracing_enabled
from services.worker.app import create_celery
from services.worker.settings import WorkerSettings
from services.worker.startup import announce_readiness, migrate_when_ready

SCHEMA_WAIT_S = 120.0


def worker_argv(settings: WorkerSettings) -> list[str]:
    argv = [
        "worker",
        f"--concurrency={settings.worker_concurrency}",
        "--pool=prefork",
        f"--queues={settings.worker_queue}",
        "--without-mingle",
        "--without-gossip",
        f"--loglevel={settings.log_level.upper()}",
        f"--hostname=loom-{os.getpid()}@%h",
    ]
    if settings.worker_gc_interval_s:
        argv.append("--beat")
    return argv


def main() -> None:
    settings = WorkerSettings()
    configure_logging("worker", settings.log_level)

    def keep_our_logging(**_: Any) -> None:  # a receiver here stops Celery configuring its own
        configure_logging("worker", settings.log_level)

    signals.setup_logging.connect(keep_our_logging, weak=False)
    app = create_celery(settings)
    # Tracing (when OTEL_* configures it) starts in each pool process: an exporter's thread
    # does not survive the fork. What a process still holds is sent before it exits.
    signals.worker_process_init.connect(lambda **_: tracing_enabled("worker"), weak=False)
    signals.worker_process_shutdown.connect(lambda **_: flush_spans(), weak=False)
    # A ready file left by a killed worker may name our pid again (pid 1 in a container).
    settings.ready_file.unlink(missing_ok=True)
    migrate_when_ready(settings.database_url_for("gateway"), SCHEMA_WAIT_S)
    settings.celery_dir.mkdir(parents=True, exist_ok=True)  # beat keeps its schedule there
    announce_readiness(app)
    app.worker_main(worker_argv(settings))


if __name__ == "__main__":
    main()
