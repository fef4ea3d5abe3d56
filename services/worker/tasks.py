"""Celery tasks: thin adapters from a message (task id, job id, params as JSON) to the plain
logic functions (`gc`, `evaluate`, `export`, a managed run's `recipe`), through
`runner.run_delivery`, which makes every delivery idempotent on the task id."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Any, cast

from celery import Task as CeleryTask

from services.common.db import transaction
from services.common.errors import InvalidInput
from services.common.logs import job_id_var, request_id_var
from services.common.tracing import extract, span_in
from services.worker.evaluate import evaluate as run_evaluation
from services.worker.evaluate import metric_points
from services.worker.export import export_merged
from services.worker.gc import collect
from services.worker.recipe_registry import load_recipe
from services.worker.recipes import Attempt, run_managed
from services.worker.runner import (
    DATABASE_DOWN,
    WAIT_POLL_S,
    Done,
    Ending,
    Outage,
    Redeliver,
    Services,
    Work,
    gateway_ending,
    run_delivery,
)
from services.worker.schemas import EvaluateParams, ExportParams, GcParams, RecipeParams, TaskKind
from services.worker.task_leases import ensure_task

if TYPE_CHECKING:
    from services.worker.app import LoomCelery

log = logging.getLogger(__name__)

TASK_NAMES: dict[TaskKind, str] = {kind: f"loom.{kind.value}" for kind in TaskKind}
SCHEDULED_GC = "loom.scheduled_gc"


def register(app: LoomCelery) -> None:
    # max_retries=None: Celery does not count; the runner bounds retries after outages and
    # carries its count in the message (`outage`).
    options: dict[str, Any] = {
        "bind": True,
        "acks_late": True,
        "reject_on_worker_lost": True,
        "max_retries": None,
    }
    app.task(name=TASK_NAMES[TaskKind.gc], **options)(gc)
    app.task(name=TASK_NAMES[TaskKind.evaluate], **options)(evaluate)
    app.task(name=TASK_NAMES[TaskKind.export], **options)(export)
    app.task(name=TASK_NAMES[TaskKind.recipe], **options)(recipe)
    app.task(name=SCHEDULED_GC, **options)(scheduled_gc)


def gc(
    task: CeleryTask,
    task_id: str,
    job_id: str | None,
    params: dict[str, Any],
    outage: dict[str, Any] | None = None,
) -> None:
    async def work(services: Services, _attempt: int) -> Done:
        return Done(await collect(services.modelstate, job_id, GcParams.model_validate(params)))

    _deliver(task, task_id, job_id, work, outage, needs=("modelstate",))


def evaluate(
    task: CeleryTask,
    task_id: str,
    job_id: str | None,
    params: dict[str, Any],
    outage: dict[str, Any] | None = None,
) -> None:
    async def work(services: Services, _attempt: int) -> Done:
        job = _job(job_id)
        result = await run_evaluation(
            services.modelstate,
            services.rollout,
            services.reward,
            job,
            EvaluateParams.model_validate(params),
        )
        return Done(result, metrics=metric_points(result))

    # Its metrics are the job's: the gateway records them with the task's end.
    _deliver(
        task,
        task_id,
        job_id,
        work,
        outage,
        needs=("modelstate", "rollout", "reward", "gateway"),
        ending=gateway_ending(_app(task).loom_settings),
    )


def export(
    task: CeleryTask,
    task_id: str,
    job_id: str | None,
    params: dict[str, Any],
    outage: dict[str, Any] | None = None,
) -> None:
    exports_dir = _app(task).loom_settings.data_dir / "exports"

    async def work(services: Services, _attempt: int) -> Done:
        return Done(
            await export_merged(
                services.modelstate, _job(job_id), ExportParams.model_validate(params), exports_dir
            )
        )

    _deliver(task, task_id, job_id, work, outage, needs=("modelstate",))


def recipe(
    task: CeleryTask,
    task_id: str,
    job_id: str | None,
    params: dict[str, Any],
    outage: dict[str, Any] | None = None,
) -> None:
    """A managed run (`recipes.run_managed`); its job ends with it, which the gateway records
    with the task's end (`gateway.jobs.jobs.end_with_run`)."""
    app = _app(task)
    run_params = RecipeParams.model_validate(params)

    async def work(_services: Services, attempt: int) -> Done:
        return Done(
            await run_managed(
                Attempt(task_id, attempt, _job(job_id), app.loom_settings, app.sessions), run_params
            )
        )

    _deliver(
        task,
        task_id,
        job_id,
        work,
        outage,
        needs=("gateway", *_recipe_services(run_params)),
        ending=gateway_ending(app.loom_settings),
    )


def scheduled_gc(task: CeleryTask, outage: dict[str, Any] | None = None) -> None:
    """Celery beat's store-wide collection, recorded as a `gc` task without a job; its id
    derives from the message id, so a redelivered message finds the same task."""
    task_id = f"task_{uuid.UUID(str(task.request.id)).hex}"
    with transaction(_app(task).sessions) as session:
        ensure_task(session, task_id, TaskKind.gc, None, GcParams().model_dump(mode="json"))
    gc(task, task_id, None, {}, outage)


def _deliver(
    task: CeleryTask,
    task_id: str,
    job_id: str | None,
    work: Work,
    outage: dict[str, Any] | None,
    *,
    needs: tuple[str, ...],
    ending: Ending | None = None,
) -> None:
    app = _app(task)
    request_id_var.set(task_id)  # the delivery's log lines name the task and its job
    job_id_var.set(job_id or "-")
    carried = Outage.model_validate(outage or {})
    # Traced: the delivery is a trace of its own, linked to the request that submitted it.
    submitted = extract(task.request.headers)
    try:
        with span_in(
            submitted,
            f"task {task.name}",
            link=True,
            attributes={"loom.task_id": task_id, "loom.job_id": job_id or ""},
        ):
            again = asyncio.run(
                run_delivery(
                    app.loom_settings, app.sessions, task_id, carried, work, needs, ending=ending
                )
            )
    except DATABASE_DOWN as exc:  # the task's row could not even be read or written
        log.warning(
            "task %s: database unavailable (%s); trying again in %.0f s",
            task_id,
            str(exc).splitlines()[0][:200],
            WAIT_POLL_S,
        )
        again = Redeliver(WAIT_POLL_S, carried)
    if again is None:
        return
    # A new message with the outage's state; this one is acknowledged when we return.
    kwargs = {**task.request.kwargs, "outage": again.outage.model_dump(mode="json")}
    task.signature_from_request(kwargs=kwargs, countdown=again.after_s).apply_async()


def _recipe_services(params: RecipeParams) -> tuple[str, ...]:
    """What the recipe calls through the gateway; none for an unknown recipe, whose attempt
    fails with that anyway."""
    try:
        return load_recipe(params.recipe).services
    except InvalidInput:
        return ()


def _app(task: CeleryTask) -> LoomCelery:
    return cast("LoomCelery", task.app)


def _job(job_id: str | None) -> str:
    if job_id is None:
        raise InvalidInput("This kind of task needs a job.")
    return job_id
