"""`Recipe`: a training loop written with the SDK, as Loom's worker hosts it (the worker's side
is `services.worker.recipe_registry.HostedRecipe`). Each attempt gets the blocking SDK's client
with a key that acts for its job only, a `RecipeRun` to start or resume from, and stop points
between steps: a cancelled or taken-over task, a cancelled job, a paused job (waited out there;
the job's status is read through the gateway with the run's key).

An error the loop meets is sorted the worker's way (`runner.RETRYABLE`: tried again, which
resumes from the last checkpoint). Two cases are recast as retryable: a 500 (a service that
died mid-request answers so), and a trainer that restarted and lost the job's model (a 404
for the model): the retry's `restore` rebuilds the model and loads the checkpoint."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from agents.recipes.run import RecipeRun
from agents.sdk.sync import LoomClient
from gateway.schemas import JobStatus
from services.common.errors import InvalidInput, LoomError, NotFound, Unavailable, UpstreamError
from services.worker.recipe_registry import RecipeAttempt, RunStopped
from services.worker.runner import RETRYABLE

C = TypeVar("C", bound=BaseModel)
PAUSE_POLL_S = 1.0


@dataclass(frozen=True)
class Recipe(Generic[C]):
    """`run(run, config)` trains the run's job from `run.start_step` on, calls
    `run.checkpoint(step, state)` at least every few steps, and returns a JSON summary."""

    name: str
    config: type[C]
    run: Callable[[RecipeRun, C], dict[str, Any]]
    description: str
    # The services its loop calls through the gateway: after an outage, a run waits for these
    # to be ready again (and for no other).
    services: tuple[str, ...] = ("trainer", "modelstate")

    def parse_config(self, raw: dict[str, Any]) -> C:
        try:
            return self.config.model_validate(raw)
        except ValidationError as exc:
            errors = [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()]
            raise InvalidInput(
                f"Config of recipe {self.name!r} is invalid: {_first_error(errors)}",
                {"errors": errors},
            ) from None

    def execute(self, attempt: RecipeAttempt, config: C) -> tuple[dict[str, Any], int]:
        """Run (or resume) to the end with the attempt's key; blocking, for a thread."""
        with LoomClient(attempt.gateway_url, attempt.secret) as loom:
            run = RecipeRun(
                loom,
                loom.get_job(attempt.job_id),
                run_id=f"{attempt.task_id}-a{attempt.attempt}",
                resumed=attempt.resumed,
                series=attempt.task_id,
                record=attempt.record,
                between_steps=lambda: _stop_point(loom, attempt),
            )
            try:
                run.restore()
                summary = self.run(run, config)
            except LoomError as exc:
                raise _recast(loom, attempt.job_id, exc) from exc
        return summary, run.last.step if run.last else 0


def _first_error(errors: list[dict[str, Any]]) -> str:
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"]) or "config"
    return f"{where}: {first['msg']}" + (f" (and {len(errors) - 1} more)" if errors[1:] else "")


def _stop_point(loom: LoomClient, attempt: RecipeAttempt) -> None:
    """Between steps: end the run if asked to; wait here while the job is paused."""
    while True:
        if attempt.stop.is_set():
            raise RunStopped(
                f"Task {attempt.task_id} was cancelled or taken over.", cancel_task=False
            )
        status = loom.get_job(attempt.job_id).info.status
        if status == JobStatus.cancelled:
            raise RunStopped(
                f"Job {attempt.job_id} was cancelled; the run stopped after its last checkpoint.",
                cancel_task=True,
            )
        if status != JobStatus.paused:
            return
        time.sleep(PAUSE_POLL_S)


def _recast(loom: LoomClient, job_id: str, exc: LoomError) -> LoomError:
    """`exc`, or a retryable error for what a resume may cure: a server fault (a service that
    died mid-request answers 500), or a trainer that no longer holds the job's model."""
    if exc.status_code >= 500 and not isinstance(exc, RETRYABLE):
        return UpstreamError(
            f"A service failed mid-run: {exc.message}; resuming from the last checkpoint.",
            exc.detail,
        )
    if not isinstance(exc, NotFound):
        return exc
    try:
        loom.get_job(job_id).model_info()
    except NotFound:
        return Unavailable(
            f"The trainer lost job {job_id}'s model (it restarted?): resuming "
            f"from the last checkpoint. ({exc.message})",
            {"job_id": job_id},
        )
    except LoomError:
        return exc
    return exc
