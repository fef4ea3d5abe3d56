"""The Celery app: built from `WorkerSettings` by the worker (which runs the tasks) and by the
gateway (which only sends them, with `send`).

Delivery is at least once: a task is acknowledged when it ends (`acks_late`), a message whose
worker process died is requeued (`task_reject_on_worker_lost`), and each worker takes one
message at a time (prefetch 1), so a crash loses nothing. Deliveries are idempotent on the
task id: the task's row (the worker's tables, in the gateway's database) decides what each one
does (`task_leases`), so a task that ended never runs again."""

from __future__ import annotations

import functools
from typing import Any

from celery import Celery
from kombu.exceptions import KombuError
from sqlalchemy.orm import Session, sessionmaker

from services.common.db import make_engine, make_sessionmaker
from services.common.errors import Unavailable
from services.common.tracing import inject
from services.worker import tasks
from services.worker.schemas import TaskKind
from services.worker.settings import WorkerSettings


class LoomCelery(Celery):
    """A Celery app that knows Loom's settings and, lazily, the worker's tables (in the
    gateway's database; built in the process that first needs them: never inherited by the
    worker's forked children)."""

    def __init__(self, settings: WorkerSettings) -> None:
        super().__init__("loom", set_as_current=False)
        self.loom_settings = settings

    @functools.cached_property
    def sessions(self) -> sessionmaker[Session]:
        return make_sessionmaker(make_engine(self.loom_settings.database_url_for("gateway")))


def create_celery(settings: WorkerSettings) -> LoomCelery:
    app = LoomCelery(settings)
    broker_url, transport_options = settings.broker()
    app.conf.update(
        broker_url=broker_url,
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=settings.worker_publish_timeout_s,
        result_backend=settings.worker_result_backend,
        task_ignore_result=settings.worker_result_backend is None,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=settings.worker_queue,
        task_publish_retry_policy={
            "max_retries": 2,
            "interval_start": 0.2,
            "interval_step": 0.5,
            "interval_max": 1.0,
        },
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        enable_utc=True,
        beat_schedule_filename=str(settings.celery_dir / "beat-schedule"),
        beat_schedule={}
        if not settings.worker_gc_interval_s
        else {"gc": {"task": tasks.SCHEDULED_GC, "schedule": settings.worker_gc_interval_s}},
    )
    tasks.register(app)
    return app


def send(
    app: Celery, task_id: str, kind: TaskKind, job_id: str | None, params: dict[str, Any]
) -> None:
    """Hand a task to the broker (the Celery task id is the task's own id), with the trace
    context of the request that submitted it in the message's headers (when traced), which
    its redeliveries keep. Unavailable if the broker cannot be reached."""
    try:
        app.send_task(
            tasks.TASK_NAMES[kind],
            args=[task_id, job_id, params],
            task_id=task_id,
            headers=inject({}),
        )
    except (KombuError, OSError) as exc:
        raise Unavailable(
            f"The task broker is unreachable ({type(exc).__name__}: {exc}); "
            f"task {task_id} was not sent.",
            {"task_id": task_id},
        ) from exc
