"""A managed run's attempt, worker side: a key that acts for the job only (the gateway makes
it: `GatewayCalls.renew_run_key`), the recipe in a thread (it uses the blocking SDK against
the gateway), its checkpoints recorded on the task row, and its stop points: a cancelled or
taken-over task, a cancelled job, a paused job (waited out there; the job's status is read
through the gateway with the run's key).

An error the recipe meets is sorted the runner's way (`runner.RETRYABLE`: tried again, which
resumes from the last checkpoint). Two cases are recast as retryable: a 500 (a service that
died mid-request answers so), and a trainer that restarted and lost the job's model (a 404
for the model): the retry's `restore` rebuilds the model and loads the checkpoint."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from agents.recipes import RecipeRun
from agents.sdk.sync import LoomClient
from services.common.db import transaction
from services.common.errors import LoomError, NotFound, Unavailable, UpstreamError
from services.common.service_token import client_of
from services.common.settings import LoomSettings
from services.worker.gateway_calls import GatewayCalls
from services.worker.recipe_registry import RunStopped, load_recipe
from services.worker.runner import RETRYABLE
from services.worker.schemas import RecipeParams, RecipeResult, RunProgress
from services.worker.task_leases import progress_of, record_progress

log = logging.getLogger(__name__)

PAUSE_POLL_S = 1.0
# The job's statuses a run stops at (the gateway's `JobStatus` values; the worker reads the
# job through the SDK).
JOB_CANCELLED, JOB_PAUSED = "cancelled", "paused"


@dataclass(frozen=True)
class Attempt:
    task_id: str
    attempt: int
    job_id: str
    settings: LoomSettings
    sessions: sessionmaker[Session]


async def run_managed(attempt: Attempt, params: RecipeParams) -> RecipeResult:
    """The attempt with a fresh key for its job (it replaces a crashed attempt's), revoked
    once the recipe's thread ends; a cancel (the claim lost) sets the thread's `stop`, which
    the recipe obeys at its next step."""
    gateway = client_of(attempt.settings, GatewayCalls)
    try:
        secret = await gateway.renew_run_key(attempt.job_id)
        stop = threading.Event()
        try:
            return await asyncio.to_thread(run_attempt, attempt, secret, params, stop)
        except asyncio.CancelledError:
            stop.set()
            raise
        finally:
            await gateway.drop_run_key(attempt.job_id)
    finally:
        await gateway.aclose()


def run_attempt(attempt: Attempt, secret: str, params: RecipeParams,
                stop: threading.Event) -> RecipeResult:
    """Run (or resume) the recipe to its end with the run's key; blocking, for a thread."""
    recipe = load_recipe(params.recipe)
    config = recipe.parse_config(params.config)
    with transaction(attempt.sessions) as session:
        progress = progress_of(session, attempt.task_id)
    resumed = RunProgress.model_validate(progress) if progress else None
    with LoomClient(attempt.settings.url_of("gateway"), secret) as loom:
        run = RecipeRun(loom, loom.get_job(attempt.job_id),
                        run_id=f"{attempt.task_id}-a{attempt.attempt}", resumed=resumed,
                        series=attempt.task_id,
                        record=lambda progress: _record(attempt, progress),
                        between_steps=lambda: _stop_point(loom, attempt, stop))
        if resumed is not None:
            log.info("task %s: resuming after step %d (checkpoint %s)", attempt.task_id,
                     resumed.step, resumed.checkpoint)
        try:
            run.restore()
            summary = recipe.run(run, config)
        except LoomError as exc:
            raise _recast(loom, attempt.job_id, exc) from exc
    steps = run.last.step if run.last else 0
    return RecipeResult(recipe=recipe.name, steps=steps, attempts=attempt.attempt,
                        summary=summary)


def _record(attempt: Attempt, progress: RunProgress) -> None:
    with transaction(attempt.sessions) as session:
        owned = record_progress(session, attempt.task_id, attempt.attempt,
                                progress.model_dump(mode="json"))
    if not owned:
        raise RunStopped(f"Task {attempt.task_id} was cancelled or taken over.",
                         cancel_task=False)


def _stop_point(loom: LoomClient, attempt: Attempt, stop: threading.Event) -> None:
    """Between steps: end the run if asked to; wait here while the job is paused."""
    while True:
        if stop.is_set():
            raise RunStopped(f"Task {attempt.task_id} was cancelled or taken over.",
                             cancel_task=False)
        status = loom.get_job(attempt.job_id).info.status
        if status == JOB_CANCELLED:
            raise RunStopped(f"Job {attempt.job_id} was cancelled; the run stopped after its "
                             "last checkpoint.", cancel_task=True)
        if status != JOB_PAUSED:
            return
        time.sleep(PAUSE_POLL_S)


def _recast(loom: LoomClient, job_id: str, exc: LoomError) -> LoomError:
    """`exc`, or a retryable error for what a resume may cure: a server fault (a service that
    died mid-request answers 500), or a trainer that no longer holds the job's model."""
    if exc.status_code >= 500 and not isinstance(exc, RETRYABLE):
        return UpstreamError(f"A service failed mid-run: {exc.message}; resuming from the "
                             "last checkpoint.", exc.detail)
    if not isinstance(exc, NotFound):
        return exc
    try:
        loom.get_job(job_id).model_info()
    except NotFound:
        return Unavailable(f"The trainer lost job {job_id}'s model (it restarted?): resuming "
                           f"from the last checkpoint. ({exc.message})", {"job_id": job_id})
    except LoomError:
        return exc
    return exc
