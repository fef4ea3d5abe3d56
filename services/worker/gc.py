"""Version garbage collection through modelstate, as a background task."""

from __future__ import annotations

from modelstate.client import ModelStateClient
from modelstate.schemas import GcReport, RetentionPolicy
from services.worker.schemas import GcParams


async def collect(modelstate: ModelStateClient, job_id: str | None, params: GcParams) -> GcReport:
    """Set the job's retention (when asked), then collect. A job's task reports only the
    job's own deleted versions; a store-wide one (no job) reports them all."""
    if job_id is not None and params.keep_last is not None:
        await modelstate.set_retention(
            job_id,
            RetentionPolicy(keep_last=params.keep_last, keep_ancestors=params.keep_ancestors),
        )
    report = await modelstate.collect_garbage()
    if job_id is None:
        return report
    mine = [name for name in report.versions_deleted if name.rpartition("@")[0] == job_id]
    return report.model_copy(update={"versions_deleted": mine})
