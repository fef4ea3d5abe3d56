"""The model-state store: blobs in, immutable versions out; aliases, pins and deletion.

Writing a version: its blobs arrive first (uploaded, or adopted from a staging directory on
this filesystem), each registered by a row; then one transaction takes the next number, inserts
the rows, moves the aliases and renames the finished version directory into place before it
commits, so a reader never sees a half-written version. Transactions that make blob files
appear or disappear hold the store's blob lock (`blob_lock`), so garbage collection never
deletes a blob a publish is about to reference. Each call owns its transaction (no HTTP here).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TypeVar

from sqlalchemy import delete, func, select, text, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from modelstate.blobstore import BlobStore, ReceivedBlob, check_manifest_paths, hash_staged
from modelstate.models import AliasRow, BlobRow, PinRow, VersionFileRow, VersionRow
from modelstate.schemas import (
    MAX_VERSION_NUMBER,
    Alias,
    FileRef,
    ManifestFile,
    PendingVersion,
    Pin,
    PublishRequest,
    StoredBlob,
    Version,
    VersionKey,
    VersionKind,
)
from services.common.errors import Conflict, InvalidInput, NotFound

LATEST = "latest"
WRITE_ATTEMPTS = 20
HASH_THREADS = 4
# Staged files smaller than this in all are hashed on the calling thread: for a version of a
# few MB, handing files to threads costs more than it saves.
PARALLEL_HASH_BYTES = 16 << 20
BLOB_LOCK_KEY = 0x4C4F4F4D  # "LOOM": PostgreSQL advisory lock for blob files
T = TypeVar("T")


def blob_lock(session: Session) -> None:
    """Serialize transactions that add or remove blob files. PostgreSQL: a transaction-scoped
    advisory lock. SQLite: each such transaction writes first, which takes the database's
    single write lock until commit."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": BLOB_LOCK_KEY})


def utcnow() -> datetime:
    return datetime.now(UTC)


class ModelStore:
    def __init__(self, sessions: sessionmaker[Session], blobs: BlobStore) -> None:
        self.sessions = sessions
        self.blobs = blobs

    # --- blobs -------------------------------------------------------------------------------

    def register_blob(self, received: ReceivedBlob) -> StoredBlob:
        return self.register_blobs([received])[0]

    def register_blobs(self, received: list[ReceivedBlob]) -> list[StoredBlob]:
        """Make received (verified) files stored blobs: rows and files appear together, in one
        transaction however many there are."""

        def register() -> list[StoredBlob]:
            with self.sessions() as session, session.begin():
                blob_lock(session)
                self._add_blobs(session, received)
            return [StoredBlob(sha256=item.sha256, size=item.size) for item in received]

        try:
            return _retry_on_conflict(register, "blob upload")
        except BaseException:
            for item in received:
                item.path.unlink(missing_ok=True)
            raise

    def _add_blobs(self, session: Session, received: list[ReceivedBlob]) -> None:
        """Rows for received files, and the files moved into place: both appear when the
        caller's transaction (holding the blob lock) commits. Files moved by a transaction
        that then rolls back are blob files without a row, which collection removes."""
        now = utcnow()
        stored = {
            row.sha256: row
            for row in session.scalars(
                select(BlobRow).where(BlobRow.sha256.in_({item.sha256 for item in received}))
            )
        }
        for item in received:
            row = stored.get(item.sha256)
            if row is None:
                stored[item.sha256] = row = BlobRow(sha256=item.sha256, size=item.size)
                session.add(row)
            row.touched_at = now
        session.flush()  # the write that takes SQLite's lock before the files move
        self.blobs.adopt_all(received)

    def blob(self, sha256: str) -> StoredBlob:
        with self.sessions() as session:
            row = session.get(BlobRow, sha256)
            if row is None or not self.blobs.blob_path(sha256).exists():
                raise NotFound(f"No blob {sha256}: upload it with PUT /v1/blobs/{sha256}.")
            return StoredBlob(sha256=row.sha256, size=row.size)

    # --- publishing --------------------------------------------------------------------------

    def publish(self, meta: PublishRequest) -> tuple[Version, bool]:
        """The new version and True; or, for a step published before with the same files,
        that version and False. A staged publish's files join the store in the version's own
        transaction; its staging directory is gone afterwards, whatever the outcome."""
        if meta.staged is None:
            files = list(meta.files)
            check_manifest_paths([f.path for f in files])
            return _retry_on_conflict(lambda: self._commit_version(meta, files), "publish")
        files, received = self._verify_staged(meta)
        try:
            return _retry_on_conflict(
                lambda: self._commit_version(meta, files, received), "publish"
            )
        finally:
            self.blobs.remove_staging(meta.staged)  # with any staged file not adopted

    def link_pending(self, meta: PublishRequest) -> PendingVersion | None:
        """For a staged publish: its files, linked where readers can open them while the
        publish verifies and commits them (see `PendingVersion`)."""
        if meta.staged is None:
            return None
        staged = self.blobs.staged_files(meta.staged)
        check_manifest_paths([path for path, _ in staged])
        directory = self.blobs.link_pending(meta.staged, staged)
        if directory is None:
            return None
        return PendingVersion(
            job_id=meta.job_id,
            kind=meta.kind,
            staged=meta.staged,
            local_path=str(directory),
            files={relative: path.stat().st_size for relative, path in staged},
        )

    def _verify_staged(self, meta: PublishRequest) -> tuple[list[FileRef], list[ReceivedBlob]]:
        """Hash the staged files (in parallel when they are big) and sync those with content
        the store lacks; check them against what `files` declares."""
        assert meta.staged is not None
        staged = self.blobs.staged_files(meta.staged)
        check_manifest_paths([path for path, _ in staged])
        declared = {f.path: f for f in meta.files}
        unknown = sorted(set(declared) - {path for path, _ in staged})
        if unknown:
            raise InvalidInput(
                f"Declared files are not in the staging directory: {unknown}", {"paths": unknown}
            )
        paths = [path for _, path in staged]
        hash_one = partial(hash_staged, stored=self.blobs.holds)
        if sum(path.stat().st_size for path in paths) < PARALLEL_HASH_BYTES:
            received = [hash_one(path) for path in paths]
        else:
            with ThreadPoolExecutor(HASH_THREADS) as pool:
                received = list(pool.map(hash_one, paths))
        refs = []
        for (relative, _), item in zip(staged, received, strict=True):
            expected = declared.get(relative)
            if expected and (expected.sha256, expected.size) != (item.sha256, item.size):
                raise InvalidInput(
                    f"Staged {relative!r} is {item.size} bytes with sha256 {item.sha256}; "
                    f"declared {expected.size} bytes, {expected.sha256}.",
                    {"path": relative, "declared": expected.sha256, "received": item.sha256},
                )
            refs.append(FileRef(path=relative, sha256=item.sha256, size=item.size))
        return refs, received

    def _commit_version(
        self, meta: PublishRequest, files: list[FileRef], received: list[ReceivedBlob] | None = None
    ) -> tuple[Version, bool]:
        """`received`: files of this version to add to the store first (a staged publish)."""
        job_id = meta.job_id
        with self.sessions() as session:  # closing without commit rolls back
            blob_lock(session)
            if received:  # a staged publish: its files are the very blobs added here
                self._add_blobs(session, received)
            else:
                _claim_blobs(session, files)
            if meta.step is not None:
                existing = session.scalar(
                    select(VersionRow).where(
                        VersionRow.job_id == job_id, VersionRow.step == meta.step
                    )
                )
                if existing is not None:
                    version = self._republish(session, existing, meta, files)
                    session.commit()
                    return version, False
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
                job_id=job_id,
                number=number,
                parent=parent,
                step=meta.step,
                kind=meta.kind.value,
                base_model=meta.base_model,
                metrics=dict(meta.metrics),
                created_at=utcnow(),
                files=[
                    VersionFileRow(path=f.path, size=f.size, sha256=f.sha256)
                    for f in sorted(files, key=lambda f: f.path)
                ],
            )
            session.add(row)
            session.flush()  # takes (job_id, number): a concurrent publisher now waits or fails
            aliases = sorted({LATEST, *meta.aliases})
            for name in aliases:
                _point_alias(session, job_id, name, number)
            session.flush()
            self.blobs.materialize(job_id, number, {f.path: f.sha256 for f in files})
            try:
                session.commit()
            except BaseException:
                self.blobs.remove_version_dir(job_id, number)
                raise
        return self._to_version(row, aliases), True

    def _republish(
        self, session: Session, row: VersionRow, meta: PublishRequest, files: list[FileRef]
    ) -> Version:
        """Publishing a step again is a retry when nothing differs; the aliases it asks for
        move to the existing version."""
        stored = {f.path: f.sha256 for f in row.files}
        offered = {f.path: f.sha256 for f in files}
        if stored != offered or row.kind != meta.kind.value:
            differ = sorted(
                p for p in stored.keys() | offered.keys() if stored.get(p) != offered.get(p)
            )
            raise Conflict(
                f"Job {meta.job_id!r} already has version {row.number} for step {meta.step} "
                f"with different files ({', '.join(differ[:5]) or 'another kind'}); a step "
                "is published once. Publish the new weights under a new step (or without "
                "one).",
                {"number": row.number, "step": meta.step, "files": differ},
            )
        for name in meta.aliases:
            _point_alias(session, meta.job_id, name, row.number)
        session.flush()
        return self._to_version(row, _aliases_of(session, meta.job_id).get(row.number, []))

    # --- aliases -----------------------------------------------------------------------------

    def move_alias(self, job_id: str, name: str, number: int) -> Alias:
        def move() -> Alias:
            with self.sessions() as session, session.begin():
                _find_version(session, job_id, number)
                _point_alias(session, job_id, name, number)
            return Alias(job_id=job_id, name=name, number=number)

        return _retry_on_conflict(move, "alias move")

    def delete_alias(self, job_id: str, name: str) -> None:
        if name == LATEST:
            raise Conflict(
                "'latest' is kept by the store (it follows each publish); move it "
                "instead of deleting it."
            )
        with self.sessions() as session, session.begin():
            if session.get(AliasRow, (job_id, name)) is None:
                raise NotFound(
                    f"Job {job_id!r} has no alias {name!r}. {_inventory(session, job_id)}"
                )
            session.execute(
                delete(AliasRow).where(AliasRow.job_id == job_id, AliasRow.name == name)
            )

    # --- deletion and pins -------------------------------------------------------------------

    def delete_version(self, job_id: str, number: int) -> Version:
        """Remove an unaliased, unpinned version; its blobs go at the next collection."""
        with self.sessions() as session, session.begin():
            row = _find_version(session, job_id, number)
            names = sorted(_aliases_of(session, job_id).get(number, []))
            if names:
                raise Conflict(
                    f"Version {number} of job {job_id!r} has aliases {names}: move or delete "
                    "them first.",
                    {"aliases": names},
                )
            holders = session.scalars(
                select(PinRow.holder).where(
                    PinRow.job_id == job_id, PinRow.number == number, PinRow.expires_at > utcnow()
                )
            ).all()
            if holders:
                raise Conflict(
                    f"Version {number} of job {job_id!r} is pinned by {sorted(holders)} (a "
                    "serving engine has it loaded); it can be deleted once they let go.",
                    {"pinned_by": sorted(holders)},
                )
            version = self._to_version(row, [])
            session.delete(row)
        self.blobs.remove_version_dir(job_id, number)
        return version

    def set_pins(self, holder: str, keys: list[VersionKey], ttl_s: float) -> list[Pin]:
        """Replace a holder's pins; versions that no longer exist are skipped."""
        expires = utcnow() + timedelta(seconds=ttl_s)

        def replace() -> list[Pin]:
            with self.sessions() as session, session.begin():
                session.execute(delete(PinRow).where(PinRow.holder == holder))
                pins = []
                for key in {(k.job_id, k.number) for k in keys}:
                    if session.scalar(
                        select(VersionRow.id).where(
                            VersionRow.job_id == key[0], VersionRow.number == key[1]
                        )
                    ):
                        session.add(
                            PinRow(holder=holder, job_id=key[0], number=key[1], expires_at=expires)
                        )
                        pins.append(
                            Pin(holder=holder, job_id=key[0], number=key[1], expires_at=expires)
                        )
            return sorted(pins, key=lambda p: (p.job_id, p.number))

        return _retry_on_conflict(replace, "pin update")

    def pins(self) -> list[Pin]:
        with self.sessions() as session:
            rows = session.scalars(
                select(PinRow)
                .where(PinRow.expires_at > utcnow())
                .order_by(PinRow.holder, PinRow.job_id, PinRow.number)
            )
            return [
                Pin(
                    holder=r.holder,
                    job_id=r.job_id,
                    number=r.number,
                    expires_at=_as_utc(r.expires_at),
                )
                for r in rows
            ]

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

    def lineage(self, job_id: str, ref: int | str) -> tuple[list[Version], bool]:
        """The version and its ancestors, newest first, and whether the chain is whole."""
        versions = {v.number: v for v in self.list_versions(job_id)}
        chain = [self.get_version(job_id, ref)]
        while (parent := chain[-1].parent) and parent in versions:
            chain.append(versions[parent])
        return chain, not chain[-1].parent

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
        return Version(
            id=row.id,
            job_id=row.job_id,
            number=row.number,
            parent=row.parent,
            step=row.step,
            kind=VersionKind(row.kind),
            base_model=row.base_model,
            metrics=dict(row.metrics),
            aliases=sorted(aliases),
            created_at=_as_utc(row.created_at),
            files=[ManifestFile(path=f.path, size=f.size, sha256=f.sha256) for f in row.files],
            local_path=str(self.blobs.version_dir(row.job_id, row.number)),
        )


def _claim_blobs(session: Session, files: list[FileRef]) -> None:
    """Every file's blob must be stored with the declared size. Touching the rows takes
    SQLite's write lock if no earlier write of the transaction did (see `blob_lock`)."""
    wanted = {f.sha256 for f in files}
    session.execute(update(BlobRow).where(BlobRow.sha256.in_(wanted)).values(touched_at=utcnow()))
    sizes = {
        sha256: size
        for sha256, size in session.execute(
            select(BlobRow.sha256, BlobRow.size).where(BlobRow.sha256.in_(wanted))
        )
    }
    missing = sorted({f.path for f in files if f.sha256 not in sizes})
    if missing:
        raise Conflict(
            f"The blobs of {missing[:10]} are not in the store: upload them (PUT "
            "/v1/blobs/<sha256>) and publish again.",
            {"missing": missing},
        )
    wrong = sorted(f.path for f in files if sizes[f.sha256] != f.size)
    if wrong:
        raise InvalidInput(
            f"Declared sizes of {wrong[:10]} differ from their stored blobs.", {"paths": wrong}
        )


def _retry_on_conflict(write: Callable[[], T], what: str) -> T:
    """Concurrent writers of one job collide on a unique key (or SQLite's lock); the loser
    simply tries again."""
    for attempt in range(WRITE_ATTEMPTS):
        try:
            return write()
        except (IntegrityError, OperationalError) as exc:
            if isinstance(exc, OperationalError) and "locked" not in str(exc):
                raise
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
    if isinstance(ref, int) or (ref.isascii() and ref.isdigit()):  # not "²": int() refuses it
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
    if number > MAX_VERSION_NUMBER:
        raise NotFound(
            f"Job {job_id!r} has no version {number}: version numbers go up to "
            f"{MAX_VERSION_NUMBER}."
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
        select(func.min(VersionRow.number), func.max(VersionRow.number), func.count()).where(
            VersionRow.job_id == job_id
        )
    ).one()
    if not count:
        return f"Job {job_id!r} has no published versions."
    aliases = session.scalars(
        select(AliasRow).where(AliasRow.job_id == job_id).order_by(AliasRow.name)
    ).all()
    named = ", ".join(f"{a.name}->{a.number}" for a in aliases) or "none"
    return f"It has {count} version(s); numbers {low}..{high}; aliases: {named}."


def _as_utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)  # SQLite keeps no zone
