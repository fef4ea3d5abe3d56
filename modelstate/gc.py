"""Retention and garbage collection.

Retention picks which versions of a job to delete: all but the newest `keep_last`, never an
aliased or pinned one, and (if asked) never an ancestor of an aliased one. Collection then
deletes blobs no version references any more and sweeps what crashed writers left behind:
temp files, abandoned staging directories, blob files without a row, version directories
without a version. Everything young (within the grace period) is left alone, so a publish in
progress never loses the blobs it is about to commit.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from sqlalchemy import delete, exists, select

from modelstate.blobstore import is_older_than
from modelstate.models import BlobRow, RetentionRow, VersionFileRow, VersionRow
from modelstate.schemas import GcReport, Retention, RetentionPolicy, Version
from modelstate.store import ModelStore, blob_lock, utcnow
from services.common.errors import Conflict

DELETE_BATCH = 500


def versions_to_delete(
    versions: Iterable[Version], policy: RetentionPolicy, pinned: set[int]
) -> list[int]:
    """Numbers the policy lets go (pure: the rules in one place)."""
    versions = sorted(versions, key=lambda v: v.number)
    if policy.keep_last == 0:
        return []
    keep = {v.number for v in versions[-policy.keep_last :]} | pinned
    aliased = [v for v in versions if v.aliases]
    keep |= {v.number for v in aliased}
    if policy.keep_ancestors:
        parents = {v.number: v.parent for v in versions}
        walked: set[int] = set()
        for version in aliased:
            parent = version.parent
            while parent and parent in parents and parent not in walked:
                walked.add(parent)
                parent = parents[parent]
        keep |= walked
    return [v.number for v in versions if v.number not in keep]


class Collector:
    def __init__(self, store: ModelStore, default: RetentionPolicy, grace_s: float) -> None:
        self.store = store
        self.default = default
        self.grace_s = grace_s

    # --- retention ---------------------------------------------------------------------------

    def retention(self, job_id: str) -> Retention:
        with self.store.sessions() as session:
            row = session.get(RetentionRow, job_id)
        if row is None:
            return Retention(job_id=job_id, is_default=True, **self.default.model_dump())
        return Retention(
            job_id=job_id,
            keep_last=row.keep_last,
            keep_ancestors=row.keep_ancestors,
            is_default=False,
        )

    def set_retention(self, job_id: str, policy: RetentionPolicy) -> Retention:
        with self.store.sessions() as session, session.begin():
            row = session.get(RetentionRow, job_id)
            if row is None:
                session.add(RetentionRow(job_id=job_id, **policy.model_dump()))
            else:
                row.keep_last, row.keep_ancestors = policy.keep_last, policy.keep_ancestors
        return self.retention(job_id)

    def apply_retention(self, job_id: str) -> list[str]:
        retention = self.retention(job_id)
        if retention.keep_last == 0:  # keep everything: runs after every publish, so stop here
            return []
        policy = RetentionPolicy(
            keep_last=retention.keep_last, keep_ancestors=retention.keep_ancestors
        )
        pinned = {p.number for p in self.store.pins() if p.job_id == job_id}
        deleted = []
        for number in versions_to_delete(self.store.list_versions(job_id), policy, pinned):
            try:
                self.store.delete_version(job_id, number)
            except Conflict:
                continue  # aliased or pinned since we looked: it stays
            deleted.append(f"{job_id}@{number}")
        return deleted

    # --- collection --------------------------------------------------------------------------

    def collect(self, grace_s: float | None = None) -> GcReport:
        grace = self.grace_s if grace_s is None else grace_s
        with self.store.sessions() as session:
            jobs = session.scalars(select(VersionRow.job_id).distinct()).all()
        deleted = [name for job_id in sorted(jobs) for name in self.apply_retention(job_id)]
        blobs_deleted, bytes_freed = self._delete_unreferenced_blobs(grace)
        blobs = self.store.blobs
        temp = blobs.remove_stale(blobs.tmp, grace) + blobs.remove_stale(blobs.staging, grace)
        return GcReport(
            versions_deleted=deleted,
            blobs_deleted=blobs_deleted,
            bytes_freed=bytes_freed,
            temp_entries_removed=temp,
            stray_entries_removed=self._remove_strays(grace),
        )

    def _delete_unreferenced_blobs(self, grace_s: float) -> tuple[int, int]:
        cutoff = utcnow() - timedelta(seconds=grace_s)
        unreferenced = (BlobRow.touched_at <= cutoff) & ~exists(
            select(VersionFileRow.version_id).where(VersionFileRow.sha256 == BlobRow.sha256)
        )
        with self.store.sessions() as session:
            candidates = session.scalars(select(BlobRow.sha256).where(unreferenced)).all()
        count = freed = 0
        for start in range(0, len(candidates), DELETE_BATCH):
            batch = candidates[start : start + DELETE_BATCH]
            with self.store.sessions() as session, session.begin():
                blob_lock(session)
                # Checked again under the lock: a publish may have claimed one meanwhile.
                gone = session.execute(
                    delete(BlobRow)
                    .where(BlobRow.sha256.in_(batch), unreferenced)
                    .returning(BlobRow.sha256, BlobRow.size)
                ).all()
                for sha256, size in gone:
                    self.store.blobs.remove_blob(sha256)
                    count, freed = count + 1, freed + size
        return count, freed

    def _remove_strays(self, grace_s: float) -> int:
        """Files and directories that only a crash between a file move and its commit leaves:
        a blob file without a row, a version directory without a version."""
        blobs = self.store.blobs
        removed = 0
        with self.store.sessions() as session:
            files = {sha: path for sha, path in blobs.blob_files() if is_older_than(path, grace_s)}
            with_rows = set(
                session.scalars(select(BlobRow.sha256).where(BlobRow.sha256.in_(list(files))))
            )
            for sha256 in files.keys() - with_rows:
                files[sha256].unlink(missing_ok=True)
                removed += 1
            for job_id, number, path in list(blobs.version_dirs()):
                if not is_older_than(path, grace_s):
                    continue
                if (
                    session.scalar(
                        select(VersionRow.id).where(
                            VersionRow.job_id == job_id, VersionRow.number == number
                        )
                    )
                    is None
                ):
                    blobs.remove_version_dir(job_id, number)
                    removed += 1
        return removed
