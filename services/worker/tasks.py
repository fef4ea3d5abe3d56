"""Celery tasks: thin adapters from a message (task id, job id, params as JSON) to the plain
logic functions (`gc`, `evaluate`, `export`), through `runner.run_delivery`, which makes every
delivery idempotent on the task id."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any, cast

from celery import Task as CeleryTask

from gateway.job_logs import log_metrics
from gateway.tasks import ensure_task
from services.common.db import transaction
from services.common.errors import InvalidInput
from services.common.logs import job_id_var, request_id_var
from services.worker.evaluate import evaluate as run_evaluation
from services.worker.evaluate import metric_points
from services.worker.export import export_merged
from services.worker.gc import collect
from services.worker.runner import Done, Services, Work, run_delivery
from services.worker.schemas import EvaluateParams, ExportParams, GcParams, TaskKind

if TYPE_CHECKING:
    from services.worker.app import LoomCelery

TASK_NAMES: dict[TaskKind, str] = {kind: f"loom.{kind.value}" for kind in TaskKind}
SCHEDULED_GC = "loom.scheduled_gc"


def register(app: LoomCelery) -> None:
    # max_retries=None: Celery does not count; the runner bounds retries after outages.
    options: dict[str, Any] = {"bind": True, "acks_late": True, "reject_on_worker_lost": True,
                               "max_retries": None}
    app.task(name=TASK_NAMES[TaskKind.gc], **options)(gc)
    app.task(name=TASK_NAMES[TaskKind.evaluate], **options)(evaluate)
    app.task(name=TASK_NAMES[TaskKind.export], **options)(export)
    app.task(name=SCHEDULED_GC, **options)(scheduled_gc)


def gc(task: CeleryTask, task_id: str, job_id: str | None, params: dict[str, Any]) -> None:
    async def work(services: Services) -> Done:
        return Done(await collect(services.modelstate, job_id, GcParams.model_validate(params)))

    _deliver(task, task_id, job_id, work)


def evaluate(task: CeleryTask, task_id: str, job_id: str | None,
             params: dict[str, Any]) -> None:
    async def work(services: Services) -> Done:
        job = _job(job_id)
        result = await run_evaluation(services.modelstate, services.rollout, services.reward,
                                      job, EvaluateParams.model_validate(params))
        points = metric_points(result)
        return Done(result, record=lambda session: log_metrics(session, job, points))

    _deliver(task, task_id, job_id, work)


def export(task: CeleryTask, task_id: str, job_id: str | None, params: dict[str, Any]) -> None:
    exports_dir = _app(task).loom_settings.data_dir / "exports"

    async def work(services: Services) -> Done:
        return Done(await export_merged(services.modelstate, _job(job_id),
                                        ExportParams.model_validate(params), exports_dir))

    _deliver(task, task_id, job_id, work)


def scheduled_gc(task: CeleryTask) -> None:
    """Celery beat's store-wide collection, recorded as a `gc` task without a job; its id
    derives from the message id, so a redelivered message finds the same task."""
    task_id = f"task_{uuid.UUID(str(task.request.id)).hex}"
    with transaction(_app(task).sessions) as session:
        ensure_task(session, task_id, TaskKind.gc, None, GcParams().model_dump(mode="json"))
    gc(task, task_id, None, {})


def _deliver(task: CeleryTask, task_id: str, job_id: str | None, work: Work) -> None:
    app = _app(task)
    request_id_var.set(task_id)  # the delivery's log lines name the task and its job
    job_id_var.set(job_id or "-")
    again = asyncio.run(run_delivery(app.loom_settings, app.sessions, task_id,
                                     task.request.retries, work))
    if again is None:
        return
    if again.counts:
        raise task.retry(countdown=again.after_s)
    # Not a retry (another worker holds the task): the same message later, same retry count.
    task.signature_from_request(countdown=again.after_s).apply_async()


def _app(task: CeleryTask) -> LoomCelery:
    return cast("LoomCelery", task.app)


def _job(job_id: str | None) -> str:
    if job_id is None:
        raise InvalidInput("This kind of task needs a job.")
    return job_id
