"""The model-state store: publish immutable versions, resolve numbers and aliases, move aliases.

Publishing writes blobs first (outside any transaction), then in one transaction takes the next
number, inserts the rows, moves the aliases and renames the finished version directory into
place before committing; a reader never sees a half-written version. Each call owns its own
transaction (no HTTP here).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, TypeVar

from sqlalchemy import func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from modelstate.blobstore import BlobStore, StoredBlob, check_manifest_paths
from modelstate.models import AliasRow, VersionFileRow, VersionRow
from modelstate.schemas import Alias, ManifestFile, PublishRequest, Version, VersionKind
from services.common.errors import Conflict, InvalidInput, NotFound

LATEST = "latest"
WRITE_ATTEMPTS = 20
T = TypeVar("T")


class ModelStore:
    def __init__(self, sessions: sessionmaker[Session], blobs: BlobStore) -> None:
        self.sessions = sessions
        self.blobs = blobs

    # --- writes ------------------------------------------------------------------------------

    def publish(self, meta: PublishRequest, files: Iterable[tuple[str, BinaryIO]]) -> Version:
        uploads = list(files)
        _check_upload(meta, [path for path, _ in uploads])
        stored = {
            path: self.blobs.put(stream, label=path, expected_sha256=meta.sha256.get(path))
            for path, stream in uploads
        }
        return _retry_on_conflict(lambda: self._commit_version(meta, stored), "publish")

    def move_alias(self, job_id: str, name: str, number: int) -> Alias:
        def move() -> Alias:
            with self.sessions() as session, session.begin():
                _find_version(session, job_id, number)
                _point_alias(session, job_id, name, number)
            return Alias(job_id=job_id, name=name, number=number)

        return _retry_on_conflict(move, "alias move")

    def _commit_version(self, meta: PublishRequest, stored: dict[str, StoredBlob]) -> Version:
        job_id = meta.job_id
        with self.sessions() as session:  # closing without commit rolls back
            previous = session.scalar(
                select(func.max(VersionRow.number)).where(VersionRow.job_id == job_id)
            )
            number = (previous or 0) + 1
            parent = meta.parent
            if parent is None:
                latest = session.get(AliasRow, (job_id, LATEST))
                parent = latest.number if latest else 0
            elif parent > 0:
                _find_version(session, job_id, parent)
            row = VersionRow(
                job_id=job_id, number=number, parent=parent, step=meta.step,
                kind=meta.kind.value, base_model=meta.base_model, metrics=dict(meta.metrics),
                created_at=datetime.now(UTC),
                files=[VersionFileRow(path=path, size=blob.size, sha256=blob.sha256)
                       for path, blob in sorted(stored.items())],
            )
            session.add(row)
            session.flush()  # takes (job_id, number): a concurrent publisher now waits or fails
            aliases = sorted({LATEST, *meta.aliases})
            for name in aliases:
                _point_alias(session, job_id, name, number)
            session.flush()
            self.blobs.materialize(job_id, number, {p: b.sha256 for p, b in stored.items()})
            try:
                session.commit()
            except BaseException:
                self.blobs.remove_version_dir(job_id, number)
                raise
        return self._to_version(row, aliases)

    # --- reads -------------------------------------------------------------------------------

    def get_version(self, job_id: str, ref: int | str) -> Version:
        with self.sessions() as session:
            row = _resolve(session, job_id, ref)
            return self._to_version(row, _aliases_of(session, job_id).get(row.number, []))

    def list_versions(self, job_id: str) -> list[Version]:
        with self.sessions() as session:
            rows = session.scalars(
                select(VersionRow).where(VersionRow.job_id == job_id).order_by(VersionRow.number)
            ).all()
            aliases = _aliases_of(session, job_id)
            return [self._to_version(row, aliases.get(row.number, [])) for row in rows]

    def versions_after(self, after_id: int, job_id: str | None, limit: int) -> list[Version]:
        """Versions with a global id above `after_id`, oldest first (for event replay)."""
        with self.sessions() as session:
            query = select(VersionRow).where(VersionRow.id > after_id)
            if job_id is not None:
                query = query.where(VersionRow.job_id == job_id)
            rows = session.scalars(query.order_by(VersionRow.id).limit(limit)).all()
            by_job = {job: _aliases_of(session, job) for job in {row.job_id for row in rows}}
            return [self._to_version(row, by_job[row.job_id].get(row.number, [])) for row in rows]

    def open_file(self, job_id: str, ref: int | str, path: str) -> Path:
        """The stored file of one manifest entry (read-only)."""
        version = self.get_version(job_id, ref)
        for entry in version.files:
            if entry.path == path:
                return self.blobs.blob_path(entry.sha256)
        listing = ", ".join(entry.path for entry in version.files[:20])
        raise NotFound(
            f"Version {version.number} of job {job_id!r} has no file {path!r}; it has: {listing}",
            {"files": [entry.path for entry in version.files]},
        )

    def ping(self) -> None:
        with self.sessions() as session:
            session.execute(text("SELECT 1"))

    def _to_version(self, row: VersionRow, aliases: list[str]) -> Version:
        created = row.created_at
        if created.tzinfo is None:  # SQLite keeps no zone; everything is stored in UTC
            created = created.replace(tzinfo=UTC)
        return Version(
            id=row.id, job_id=row.job_id, number=row.number, parent=row.parent, step=row.step,
            kind=VersionKind(row.kind), base_model=row.base_model, metrics=dict(row.metrics),
            aliases=sorted(aliases), created_at=created,
            files=[ManifestFile(path=f.path, size=f.size, sha256=f.sha256) for f in row.files],
            local_path=str(self.blobs.version_dir(row.job_id, row.number)),
        )


def _check_upload(meta: PublishRequest, paths: list[str]) -> None:
    if not paths:
        raise InvalidInput("A version needs at least one file.")
    check_manifest_paths(paths)
    undeclared = sorted(set(meta.sha256) - set(paths))
    if undeclared:
        raise InvalidInput(
            f"sha256 declared for files that were not uploaded: {undeclared}",
            {"paths": undeclared},
        )


def _retry_on_conflict(write: Callable[[], T], what: str) -> T:
    """Concurrent writers of one job collide on a unique key; the loser simply tries again."""
    for attempt in range(WRITE_ATTEMPTS):
        try:
            return write()
        except IntegrityError:
            time.sleep(random.uniform(0, 0.005 * (attempt + 1)))
    raise Conflict(f"{what} kept colliding with concurrent writers; try again.")


def _point_alias(session: Session, job_id: str, name: str, number: int) -> None:
    alias = session.get(AliasRow, (job_id, name))
    if alias is None:
        session.add(AliasRow(job_id=job_id, name=name, number=number))
    else:
        alias.number = number


def _aliases_of(session: Session, job_id: str) -> dict[int, list[str]]:
    by_number: dict[int, list[str]] = {}
    for alias in session.scalars(select(AliasRow).where(AliasRow.job_id == job_id)):
        by_number.setdefault(alias.number, []).append(alias.name)
    return by_number


def _resolve(session: Session, job_id: str, ref: int | str) -> VersionRow:
    if isinstance(ref, int) or ref.isdigit():
        return _find_version(session, job_id, int(ref))
    alias = session.get(AliasRow, (job_id, ref))
    if alias is None:
        raise NotFound(f"Job {job_id!r} has no alias {ref!r}. {_inventory(session, job_id)}")
    return _find_version(session, job_id, alias.number)


def _find_version(session: Session, job_id: str, number: int) -> VersionRow:
    if number == 0:
        raise NotFound(
            f"Version 0 of job {job_id!r} is its base model, which modelstate does not store."
        )
    row = session.scalar(
        select(VersionRow).where(VersionRow.job_id == job_id, VersionRow.number == number)
    )
    if row is None:
        raise NotFound(f"Job {job_id!r} has no version {number}. {_inventory(session, job_id)}")
    return row


def _inventory(session: Session, job_id: str) -> str:
    """What does exist, so a 404 tells the caller what to ask for instead."""
    low, high, count = session.execute(
        select(func.min(VersionRow.number), func.max(VersionRow.number), func.count())
        .where(VersionRow.job_id == job_id)
    ).one()
    if not count:
        return f"Job {job_id!r} has no published versions."
    aliases = session.scalars(select(AliasRow).where(AliasRow.job_id == job_id)
                              .order_by(AliasRow.name)).all()
    named = ", ".join(f"{a.name}->{a.number}" for a in aliases) or "none"
    return f"It has {count} version(s), numbered {low}..{high}; aliases: {named}."
