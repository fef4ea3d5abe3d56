"""A managed run's attempt, worker side: a key that acts for the job only, the recipe in a
thread (it uses the blocking SDK against the gateway), its checkpoints recorded on the task
row, and its stop points: a cancelled or taken-over task, a cancelled job, a paused job
(waited out there).

An error the recipe meets is sorted the runner's way (`runner.RETRYABLE`: tried again, which
resumes from the last checkpoint). Two cases are recast as retryable: a 500 (a service that
died mid-request answers so), and a trainer that restarted and lost the job's model (a 404
for the model): the retry's `restore` rebuilds the model and loads the checkpoint."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from agents.recipes import RecipeRun
from agents.sdk.sync import LoomClient
from gateway.auth.keys import create_job_key, revoke_job_keys
from gateway.models import BackgroundTaskRow, JobRow
from gateway.schemas import JobStatus
from gateway.task_leases import record_progress
from services.common.db import transaction
from services.common.errors import LoomError, NotFound, Unavailable, UpstreamError
from services.worker.recipe_registry import RunStopped, load_recipe
from services.worker.runner import RETRYABLE
from services.worker.schemas import RecipeParams, RecipeResult, RunProgress

log = logging.getLogger(__name__)

RUN_KEY_NAME = "managed run"
PAUSE_POLL_S = 1.0


@dataclass(frozen=True)
class Attempt:
    task_id: str
    attempt: int
    job_id: str
    gateway_url: str
    sessions: sessionmaker[Session]


def run_attempt(attempt: Attempt, params: RecipeParams, stop: threading.Event) -> RecipeResult:
    """Run (or resume) the recipe to its end; blocking, for a thread."""
    recipe = load_recipe(params.recipe)
    config = recipe.parse_config(params.config)
    with transaction(attempt.sessions) as session:
        row = session.get(BackgroundTaskRow, attempt.task_id)
        resumed = RunProgress.model_validate(row.progress) if row and row.progress else None
        revoke_job_keys(session, attempt.job_id, RUN_KEY_NAME)  # a crashed attempt's
        secret = create_job_key(session, attempt.job_id, RUN_KEY_NAME)
    try:
        with LoomClient(attempt.gateway_url, secret) as loom:
            run = RecipeRun(loom, loom.get_job(attempt.job_id),
                            run_id=f"{attempt.task_id}-a{attempt.attempt}", resumed=resumed,
                            series=attempt.task_id,
                            record=lambda progress: _record(attempt, progress),
                            between_steps=lambda: _stop_point(attempt, stop))
            if resumed is not None:
                log.info("task %s: resuming after step %d (checkpoint %s)", attempt.task_id,
                         resumed.step, resumed.checkpoint)
            try:
                run.restore()
                summary = recipe.run(run, config)
            except LoomError as exc:
                raise _recast(loom, attempt.job_id, exc) from exc
    finally:
        with transaction(attempt.sessions) as session:
            revoke_job_keys(session, attempt.job_id, RUN_KEY_NAME)
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


def _stop_point(attempt: Attempt, stop: threading.Event) -> None:
    """Between steps: end the run if asked to; wait here while the job is paused."""
    while True:
        if stop.is_set():
            raise RunStopped(f"Task {attempt.task_id} was cancelled or taken over.",
                             cancel_task=False)
        status = _job_status(attempt)
        if status is JobStatus.cancelled:
            raise RunStopped(f"Job {attempt.job_id} was cancelled; the run stopped after its "
                             "last checkpoint.", cancel_task=True)
        if status is not JobStatus.paused:
            return
        time.sleep(PAUSE_POLL_S)


def _job_status(attempt: Attempt) -> JobStatus | None:
    with transaction(attempt.sessions) as session:
        job = session.get(JobRow, attempt.job_id)
        return JobStatus(job.status) if job is not None else None


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
