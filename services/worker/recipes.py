"""A managed run's attempt, worker side: a key that acts for the job only (the gateway makes
it: `GatewayCalls.renew_run_key`), the recipe in a thread (`HostedRecipe.execute`: Loom's
recipes use the blocking SDK against the gateway, see `agents.recipes.recipe`), its
checkpoints recorded on the task row, and the stop flag a lost claim sets."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from services.common.db import transaction
from services.common.service_token import client_of
from services.common.settings import LoomSettings
from services.worker.gateway_calls import GatewayCalls
from services.worker.recipe_registry import RecipeAttempt, RunStopped, load_recipe
from services.worker.schemas import RecipeParams, RecipeResult, RunProgress
from services.worker.task_leases import progress_of, record_progress

log = logging.getLogger(__name__)


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


def run_attempt(
    attempt: Attempt, secret: str, params: RecipeParams, stop: threading.Event
) -> RecipeResult:
    """Run (or resume) the recipe to its end with the run's key; blocking, for a thread."""
    recipe = load_recipe(params.recipe)
    config = recipe.parse_config(params.config)
    with transaction(attempt.sessions) as session:
        progress = progress_of(session, attempt.task_id)
    resumed = RunProgress.model_validate(progress) if progress else None
    if resumed is not None:
        log.info(
            "task %s: resuming after step %d (checkpoint %s)",
            attempt.task_id,
            resumed.step,
            resumed.checkpoint,
        )
    summary, steps = recipe.execute(
        RecipeAttempt(
            task_id=attempt.task_id,
            attempt=attempt.attempt,
            job_id=attempt.job_id,
            gateway_url=attempt.settings.url_of("gateway"),
            secret=secret,
            resumed=resumed,
            record=lambda progress: _record(attempt, progress),
            stop=stop,
        ),
        config,
    )
    return RecipeResult(recipe=recipe.name, steps=steps, attempts=attempt.attempt, summary=summary)


def _record(attempt: Attempt, progress: RunProgress) -> None:
    with transaction(attempt.sessions) as session:
        owned = record_progress(
            session, attempt.task_id, attempt.attempt, progress.model_dump(mode="json")
        )
    if not owned:
        raise RunStopped(f"Task {attempt.task_id} was cancelled or taken over.", cancel_task=False)
