"""The job state machine: every status change goes through `move_job`, checked against one
table of allowed moves.

created   → the row exists; the trainer has not (yet) built the model
running   → the trainer holds the job's model; the script trains and samples
paused    → the owner paused it (a managed job's runner stops between steps); can resume
completed → the script said it is done, or its managed run succeeded
failed    → the trainer refused or could not be reached at creation, the script gave up, or
            its managed run failed for good (`jobs.end_with_run`); retrying that run
            reopens it (`reopen_job`)
cancelled → the owner stopped it (or its managed run) for good
"""

from __future__ import annotations

from gateway.models import JobRow
from gateway.schemas import JobStatus
from services.common.states import require_transition

TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.created: frozenset({JobStatus.running, JobStatus.failed, JobStatus.cancelled}),
    JobStatus.running: frozenset(
        {JobStatus.paused, JobStatus.completed, JobStatus.failed, JobStatus.cancelled}
    ),
    JobStatus.paused: frozenset({JobStatus.running, JobStatus.failed, JobStatus.cancelled}),
    JobStatus.completed: frozenset(),
    JobStatus.failed: frozenset(),
    JobStatus.cancelled: frozenset(),
}


def reopen_job(job: JobRow) -> None:
    """The one way out of a final state: a `failed` job whose failed managed run is retried
    runs again (`jobs.reopen_for_retry` decides when). Not a move anyone can ask for."""
    require_transition(
        {JobStatus.failed: frozenset({JobStatus.running})},
        JobStatus(job.status),
        JobStatus.running,
        f"Job {job.id}",
        {"job_id": job.id},
    )
    job.status = JobStatus.running.value


def move_job(job: JobRow, target: JobStatus) -> None:
    require_transition(
        TRANSITIONS, JobStatus(job.status), target, f"Job {job.id}", {"job_id": job.id}
    )
    job.status = target.value
