"""The data behind each admin page, gathered from the gateway's database and its services.

Every read goes through the same data functions as the API (`jobs`, `job_logs`), with the
viewer's key, so the admin can never show a job the key could not read through `/v1/jobs`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from gateway.admin import upstream
from gateway.admin.charts import Chart, build_charts, charts_payload
from gateway.admin.upstream import Fetched, ReplicaView
from gateway.auth.keys import KeyIdentity
from gateway.jobs import jobs
from gateway.jobs import logs as job_logs
from gateway.proxy.replicas import ReplicaRegistry
from gateway.proxy.upstreams import Upstreams
from gateway.schemas import Job, LoggedSample
from gateway.tasks import tasks
from modelstate.schemas import Version
from services.common.db import in_transaction
from services.common.errors import Forbidden
from services.rollout.schemas import ReplicaPublic
from services.worker.task_schemas import BackgroundTask

SAMPLES_SHOWN = 20
VERSIONS_PER_PAGE = 20
Sessions = sessionmaker[Session]


@dataclass(frozen=True)
class VersionFilter:
    """Which versions the table shows: a page of all of them, or of the aliased ones only."""

    page: int = 1
    aliased: bool = False


@dataclass
class JobPage:
    job: Job
    run: BackgroundTask | None
    charts: list[Chart]
    samples: list[LoggedSample]
    versions: Fetched[list[Version]]
    replicas: list[ReplicaView]
    version_filter: VersionFilter = VersionFilter()

    @property
    def chart_data(self) -> dict[str, Any]:
        return charts_payload(self.charts)

    @property
    def phases(self) -> list[tuple[str, list[Chart]]]:
        """The charts by phase, in the order `build_charts` put them."""
        groups: dict[str, list[Chart]] = {}
        for chart in self.charts:
            groups.setdefault(chart.phase, []).append(chart)
        return list(groups.items())

    @property
    def version_numbers(self) -> set[int]:
        return {v.number for v in self.versions.value or []}

    @property
    def listed_versions(self) -> list[Version]:
        """The versions the filter keeps, newest first."""
        versions = self.versions.value or []
        return [v for v in versions if v.aliases] if self.version_filter.aliased else versions

    @property
    def version_pages(self) -> int:
        return max(1, -(-len(self.listed_versions) // VERSIONS_PER_PAGE))

    @property
    def version_page(self) -> int:
        """The page asked for, or the last one when it asked past the end."""
        return min(self.version_filter.page, self.version_pages)

    @property
    def shown_versions(self) -> list[Version]:
        start = (self.version_page - 1) * VERSIONS_PER_PAGE
        return self.listed_versions[start : start + VERSIONS_PER_PAGE]

    @property
    def alias_names(self) -> list[str]:
        return sorted({a for v in self.versions.value or [] for a in v.aliases})


async def jobs_overview(sessions: Sessions, viewer: KeyIdentity) -> list[Job]:
    return await in_transaction(sessions, lambda s: jobs.list_jobs(s, viewer))


async def job_summary(sessions: Sessions, viewer: KeyIdentity, job_id: str) -> Job:
    """The job if the viewer may see it (NotFound otherwise, as the API answers)."""
    return await in_transaction(sessions, lambda s: jobs.get_job(s, job_id, viewer))


async def job_status(
    sessions: Sessions, viewer: KeyIdentity, job_id: str
) -> tuple[Job, BackgroundTask | None]:
    """The job and its newest managed run: the summary box's contents."""

    def read(session: Session) -> tuple[Job, BackgroundTask | None]:
        job = jobs.get_job(session, job_id, viewer)
        return job, tasks.latest_run(session, job.id)

    return await in_transaction(sessions, read)


async def job_page(
    sessions: Sessions,
    upstreams: Upstreams,
    viewer: KeyIdentity,
    job_id: str,
    version_filter: VersionFilter = VersionFilter(),
) -> JobPage:
    def read(
        session: Session,
    ) -> tuple[Job, BackgroundTask | None, list[Chart], list[LoggedSample]]:
        job = jobs.get_job(session, job_id, viewer)  # the ownership check comes first
        series = job_logs.metric_series(session, job.id)
        return (
            job,
            tasks.latest_run(session, job.id),
            build_charts(series),
            job_logs.recent_samples(session, job.id, SAMPLES_SHOWN),
        )

    job, run, charts, samples = await in_transaction(sessions, read)
    versions, replicas = await asyncio.gather(
        upstream.job_versions(upstreams, job.id), upstream.rollout_replicas(upstreams, job.id)
    )
    return JobPage(
        job=job,
        run=run,
        charts=charts,
        samples=samples,
        versions=versions,
        replicas=replicas,
        version_filter=version_filter,
    )


async def job_charts(sessions: Sessions, viewer: KeyIdentity, job_id: str) -> dict[str, Any]:
    """Just the charts' data, for the page's periodic refresh."""

    def read(session: Session) -> dict[str, Any]:
        job = jobs.get_job_row(session, job_id, viewer)
        return charts_payload(build_charts(job_logs.metric_series(session, job.id)))

    return await in_transaction(sessions, read)


async def job_samples(sessions: Sessions, viewer: KeyIdentity, job_id: str) -> list[LoggedSample]:
    def read(session: Session) -> list[LoggedSample]:
        job = jobs.get_job_row(session, job_id, viewer)
        return job_logs.recent_samples(session, job.id, SAMPLES_SHOWN)

    return await in_transaction(sessions, read)


def replica_table(
    replicas: ReplicaRegistry, viewer: KeyIdentity, *, required: bool = False
) -> list[ReplicaPublic] | None:
    """The rollout routing table, for admin keys only (as `GET /v1/rollout/replicas`): it
    names every job's resident versions and the replicas' addresses. None for another key,
    or a 403 where the table was asked for itself."""
    if viewer.admin:
        return replicas.public()
    if required:
        raise Forbidden("The rollout replicas are shown to admin keys only.")
    return None
