"""Content-addressed blobs on local disk, and version directories made of hard links to them.

Layout under the root: `sha256/ab/<hex>` (one read-only file per distinct content),
`versions/<job_id>/<number>/<path>` (what engines read in place), `tmp/` (uploads in progress),
`staging/<name>/` (directories writers on this filesystem fill, then publish), `tmp/pending-*/`
(links to staged files being published, for engines to start reading early), `exports/`
(derived downloads such as merged LoRA models). Everything is on one filesystem, so a finished
file or directory appears with one atomic rename. This module only touches files; which blobs
exist is the database's business (`modelstate.store`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path, PurePosixPath

from services.common.errors import InvalidInput, NotFound, PayloadTooLarge
from services.common.files import fsync_path

SYNC_FILE_RANGE_WRITE = 2
_sync_file_range = getattr(ctypes.CDLL(None, use_errno=True), "sync_file_range", None)
if _sync_file_range is not None:
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]

CHUNK_BYTES = 1 << 20
MAX_PATH_CHARS = 1024
MARKER_FILE = ".loom-store-id"
PENDING_PREFIX = "pending-"
PENDING_TTL_S = 600.0  # far longer than an engine takes to read a version's files
# How often a publish looks for expired pending directories. Looking at every publish cost
# more than the publish itself in a fast loop, whose last ten minutes leave hundreds of them:
# the tiny model's publishes 271-300 took 32.5 ms (p50) that way, 15.2 ms with a sweep a
# minute (bench/results/store_publish.md).
PENDING_SWEEP_S = 60.0


@dataclass(frozen=True)
class ReceivedBlob:
    """Bytes written and hashed into `path`, not yet part of the store. `synced`: the bytes
    are on disk (fsync); a file left unsynced because the store already held its content is
    synced at adoption should that content be gone by then (`BlobStore.adopt_all`)."""

    path: Path
    sha256: str
    size: int
    synced: bool = True


def check_relative_path(path: str) -> str:
    """A manifest path must stay inside its version directory, on every OS that reads it."""
    parts = path.split("/")
    problem = None
    if not path or len(path) > MAX_PATH_CHARS:
        problem = f"must be 1..{MAX_PATH_CHARS} characters"
    elif "\\" in path or "\x00" in path:
        problem = "must not contain backslashes or NUL"
    elif path.startswith("/"):
        problem = "must be relative"
    elif any(part in ("", ".", "..") for part in parts):
        problem = "must not contain empty, '.' or '..' segments"
    if problem:
        raise InvalidInput(f"Unsafe file path {path!r}: {problem}.", {"path": path})
    return path


def check_manifest_paths(paths: list[str]) -> None:
    """Distinct safe paths, none of which is also a directory of another."""
    seen: set[str] = set()
    for path in paths:
        check_relative_path(path)
        if path in seen:
            raise InvalidInput(f"File path {path!r} appears twice.", {"path": path})
        seen.add(path)
    for path in paths:
        for parent in PurePosixPath(path).parents:
            if str(parent) in seen:
                raise InvalidInput(
                    f"{str(parent)!r} is both a file and the directory of {path!r}.",
                    {"path": path},
                )


def hash_file(path: Path) -> tuple[str, int]:
    """sha256 and size (hashlib releases the GIL: several files hash in parallel threads)."""
    with open(path, "rb") as source:
        return _hash_stream(source)


def hash_staged(path: Path, stored: Callable[[str], bool]) -> ReceivedBlob:
    """hash_file, and the file made durable (a staged file may be in the page cache only)
    unless `stored(sha256)` says the store holds that content already: then the file is
    dropped at adoption, and its fsync (the most a small file costs) is saved. The disk starts
    writing the file back first (sync_file_range, where libc has it), so the write-back runs
    while the file is hashed and the fsync only waits for what is left."""
    with open(path, "rb") as source:
        if _sync_file_range is not None:
            _sync_file_range(source.fileno(), 0, 0, SYNC_FILE_RANGE_WRITE)
        sha256, size = _hash_stream(source)
        synced = not stored(sha256)
        if synced:
            os.fsync(source.fileno())
    return ReceivedBlob(path, sha256, size, synced)


def _hash_stream(source: BufferedReader) -> tuple[str, int]:
    """Read into one buffer rather than a new bytes object per chunk: a fifth less time
    (64 MiB cached: 34 against 42 ms)."""
    digest = hashlib.sha256()
    buffer = memoryview(bytearray(CHUNK_BYTES))
    size = 0
    while count := source.readinto(buffer):
        digest.update(buffer[:count])
        size += count
    return digest.hexdigest(), size


class BlobWriter:
    """Incoming bytes → a temp file under `tmp/`, hashed as they are written. `finish` makes
    them durable and checks what the sender declared; `abort` leaves nothing behind."""

    def __init__(self, tmp: Path, label: str, max_bytes: int) -> None:
        self.label = label
        self.max_bytes = max_bytes
        self.path = tmp / f"blob-{uuid.uuid4().hex}"
        self.size = 0
        self._digest = hashlib.sha256()
        self._file = open(self.path, "wb")  # noqa: SIM115 -- closed by finish/abort

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.max_bytes:
            raise PayloadTooLarge(
                f"{self.label!r} is larger than the limit of {self.max_bytes} bytes."
            )
        self._digest.update(data)
        self._file.write(data)

    def finish(
        self, expected_sha256: str | None = None, expected_size: int | None = None
    ) -> ReceivedBlob:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        sha256 = self._digest.hexdigest()
        if expected_size is not None and expected_size != self.size:
            raise InvalidInput(
                f"{self.label!r}: expected {expected_size} bytes but received {self.size}; "
                "the upload was truncated or the declaration is wrong.",
                {"path": self.label, "declared_size": expected_size, "received": self.size},
            )
        if expected_sha256 is not None and expected_sha256.lower() != sha256:
            raise InvalidInput(
                f"{self.label!r}: declared sha256 {expected_sha256} but received {sha256} "
                f"({self.size} bytes); the upload was corrupted or the declaration is wrong.",
                {"path": self.label, "declared": expected_sha256, "received": sha256},
            )
        return ReceivedBlob(self.path, sha256, self.size)

    def abort(self) -> None:
        self._file.close()
        self.path.unlink(missing_ok=True)


class BlobStore:
    def __init__(self, root: Path, max_file_bytes: int) -> None:
        self.root = root
        self.max_file_bytes = max_file_bytes
        self.blobs = root / "sha256"
        self.versions = root / "versions"
        self.tmp = root / "tmp"
        self.staging = root / "staging"
        self.exports = root / "exports"
        for directory in (self.blobs, self.versions, self.tmp, self.staging, self.exports):
            directory.mkdir(parents=True, exist_ok=True)
        self.instance_id = self._instance_id()
        self._next_pending_sweep = 0.0  # time.monotonic(): the first publish sweeps

    def _instance_id(self) -> str:
        """A random id kept in the staging directory: a writer that reads the same id there
        shares this filesystem."""
        marker = self.staging / MARKER_FILE
        if not marker.exists():
            temp = self.tmp / f"marker-{uuid.uuid4().hex}"
            temp.write_text(uuid.uuid4().hex)
            os.replace(temp, marker)
        return marker.read_text().strip()

    # --- blobs -------------------------------------------------------------------------------

    def blob_path(self, sha256: str) -> Path:
        return self.blobs / sha256[:2] / sha256

    def holds(self, sha256: str) -> bool:
        return self.blob_path(sha256).exists()

    def writer(self, label: str) -> BlobWriter:
        return BlobWriter(self.tmp, label, self.max_file_bytes)

    def adopt_all(self, files: list[ReceivedBlob]) -> None:
        """Move verified files (temp blobs or staged files, on this filesystem) into place;
        identical content already there wins and the source is dropped. Call it holding the
        blob lock (`modelstate.store.blob_lock`), so what is there stays there. Each touched
        directory is synced once, after all the renames."""
        touched: set[Path] = set()
        for received in files:
            source, final = received.path, self.blob_path(received.sha256)
            if final.exists():
                source.unlink(missing_ok=True)
                continue
            if not received.synced:  # its content was collected since it was hashed
                fsync_path(source)
            final.parent.mkdir(exist_ok=True)
            os.utime(source)  # young until committed: collection spares it for the grace period
            source.chmod(0o444)  # hard links share the mode: version files stay read-only
            os.rename(source, final)
            touched.add(final.parent)
        for directory in touched:
            fsync_path(directory)

    def remove_blob(self, sha256: str) -> None:
        self.blob_path(sha256).unlink(missing_ok=True)

    def blob_files(self) -> Iterator[tuple[str, Path]]:
        for shard in self.blobs.iterdir():
            for path in shard.iterdir():
                yield path.name, path

    # --- staging -----------------------------------------------------------------------------

    def new_staging_name(self) -> str:
        name = uuid.uuid4().hex
        (self.staging / name).mkdir()
        return name

    def staged_files(self, name: str) -> list[tuple[str, Path]]:
        """(manifest path, file) for every regular file a writer left in `staging/<name>`."""
        directory = self.staging / name
        if not directory.is_dir():
            raise NotFound(
                f"No staging directory {name!r}: it was never made, already "
                "published, or collected as abandoned."
            )
        found = []
        for path in sorted(directory.rglob("*")):
            mode = path.lstat().st_mode
            if stat.S_ISDIR(mode):
                continue
            relative = path.relative_to(directory).as_posix()
            if not stat.S_ISREG(mode):
                raise InvalidInput(f"Staged entry {relative!r} is not a regular file.")
            found.append((relative, path))
        if not found:
            raise InvalidInput(f"Staging directory {name!r} holds no files.")
        return found

    def link_pending(self, name: str, staged: list[tuple[str, Path]]) -> Path | None:
        """Hard links to the staged files in `tmp/pending-<name>/`, readable while the publish
        moves the staged files into place (links never move); None where links cannot be made.
        Pending directories older than `PENDING_TTL_S` go first (looked for once every
        `PENDING_SWEEP_S`); garbage collection removes any left."""
        now = time.monotonic()
        if now >= self._next_pending_sweep:
            self._next_pending_sweep = now + PENDING_SWEEP_S
            self.sweep_pending()
        directory = self.tmp / f"{PENDING_PREFIX}{name}"
        shutil.rmtree(directory, ignore_errors=True)  # from an attempt that failed
        try:
            for relative, path in staged:
                target = directory / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                os.link(path, target)
        except OSError:
            shutil.rmtree(directory, ignore_errors=True)
            return None
        return directory

    def sweep_pending(self) -> None:
        """Remove pending directories older than `PENDING_TTL_S`. Each is made whole at once,
        so its own time says its age: no need to look at its files."""
        cutoff = time.time() - PENDING_TTL_S
        for old in self.tmp.glob(f"{PENDING_PREFIX}*"):
            with contextlib.suppress(FileNotFoundError):  # another publish's sweep took it
                if old.lstat().st_mtime <= cutoff:
                    shutil.rmtree(old, ignore_errors=True)

    def remove_staging(self, name: str) -> None:
        shutil.rmtree(self.staging / name, ignore_errors=True)

    # --- version directories ------------------------------------------------------------------

    def version_dir(self, job_id: str, number: int) -> Path:
        return self.versions / job_id / str(number)

    def materialize(self, job_id: str, number: int, files: dict[str, str]) -> Path:
        """Build `versions/<job>/<number>` (path → sha256) in tmp, then rename it into place,
        so a reader sees all of the directory or none of it."""
        check_manifest_paths(list(files))
        staging = self.tmp / f"version-{uuid.uuid4().hex}"
        try:
            for path, sha256 in files.items():
                target = staging / path
                target.parent.mkdir(parents=True, exist_ok=True)
                _link_or_copy(self.blob_path(sha256), target)
            final = self.version_dir(job_id, number)
            final.parent.mkdir(parents=True, exist_ok=True)
            if final.exists():
                # Left by a publish that crashed before its commit: the number was never taken.
                shutil.rmtree(final)
            os.rename(staging, final)
            fsync_path(final.parent)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return final

    def remove_version_dir(self, job_id: str, number: int) -> None:
        shutil.rmtree(self.version_dir(job_id, number), ignore_errors=True)
        shutil.rmtree(self.exports / job_id / str(number), ignore_errors=True)

    def version_dirs(self) -> Iterator[tuple[str, int, Path]]:
        for job_dir in self.versions.iterdir():
            for path in job_dir.iterdir():
                if path.name.isdigit():
                    yield job_dir.name, int(path.name), path

    # --- housekeeping -------------------------------------------------------------------------

    def remove_stale(self, directory: Path, older_than_s: float) -> int:
        """Delete entries of `directory` untouched for `older_than_s` (left by a writer or a
        store that died mid-way); the marker file stays."""
        removed = 0
        cutoff = time.time() - older_than_s
        for entry in directory.iterdir():
            if entry.name == MARKER_FILE or _newest_mtime(entry) > cutoff:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed += 1
        return removed


def is_older_than(path: Path, seconds: float) -> bool:
    try:
        return _newest_mtime(path) <= time.time() - seconds
    except FileNotFoundError:
        return False


def _newest_mtime(entry: Path) -> float:
    """A directory counts as touched when anything inside it was (a writer still filling it)."""
    newest = entry.lstat().st_mtime
    if entry.is_dir() and not entry.is_symlink():
        for path in entry.rglob("*"):
            try:
                newest = max(newest, path.lstat().st_mtime)
            except FileNotFoundError:
                continue
    return newest


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError as exc:
        # Too many links to one blob, or a filesystem without hard links: copy instead.
        if exc.errno not in (errno.EMLINK, errno.EXDEV, errno.EPERM, errno.ENOTSUP):
            raise
        shutil.copyfile(source, target)
        target.chmod(0o444)
