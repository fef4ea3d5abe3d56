"""Content-addressed blobs on local disk, and version directories made of hard links to them.

Layout under the root: `sha256/ab/<hex>` (one file per distinct content, read-only),
`versions/<job_id>/<number>/<path>` (what engines read in place), `tmp/` (work in progress, on
the same filesystem so a finished file or directory appears with one atomic rename).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from services.common.errors import InvalidInput, PayloadTooLarge

CHUNK_BYTES = 1 << 20
MAX_PATH_CHARS = 1024


@dataclass(frozen=True)
class StoredBlob:
    sha256: str
    size: int


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


class BlobStore:
    def __init__(self, root: Path, max_file_bytes: int) -> None:
        self.root = root
        self.max_file_bytes = max_file_bytes
        self.blobs = root / "sha256"
        self.versions = root / "versions"
        self.tmp = root / "tmp"
        for directory in (self.blobs, self.versions, self.tmp):
            directory.mkdir(parents=True, exist_ok=True)

    def blob_path(self, sha256: str) -> Path:
        return self.blobs / sha256[:2] / sha256

    def version_dir(self, job_id: str, number: int) -> Path:
        return self.versions / job_id / str(number)

    def put(
        self, stream: BinaryIO, *, label: str, expected_sha256: str | None = None
    ) -> StoredBlob:
        """Stream into a temp file while hashing, check, then rename into place; identical
        content is stored once."""
        digest = hashlib.sha256()
        size = 0
        temp = self.tmp / f"blob-{uuid.uuid4().hex}"
        try:
            with open(temp, "wb") as out:
                while chunk := stream.read(CHUNK_BYTES):
                    size += len(chunk)
                    if size > self.max_file_bytes:
                        raise PayloadTooLarge(
                            f"{label!r} is larger than the limit of {self.max_file_bytes} bytes."
                        )
                    digest.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            sha256 = digest.hexdigest()
            if expected_sha256 is not None and expected_sha256.lower() != sha256:
                raise InvalidInput(
                    f"{label!r}: declared sha256 {expected_sha256} but received {sha256} "
                    f"({size} bytes); the upload was corrupted or the declaration is wrong.",
                    {"path": label, "declared": expected_sha256, "received": sha256},
                )
            final = self.blob_path(sha256)
            if final.exists():
                temp.unlink()
            else:
                final.parent.mkdir(exist_ok=True)
                temp.chmod(0o444)  # hard links share the mode: version files stay read-only
                os.rename(temp, final)
                _fsync_dir(final.parent)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        return StoredBlob(sha256=sha256, size=size)

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
            _fsync_dir(final.parent)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return final

    def remove_version_dir(self, job_id: str, number: int) -> None:
        shutil.rmtree(self.version_dir(job_id, number), ignore_errors=True)


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError as exc:
        # Too many links to one blob, or a filesystem without hard links: copy instead.
        if exc.errno not in (errno.EMLINK, errno.EXDEV, errno.EPERM, errno.ENOTSUP):
            raise
        shutil.copyfile(source, target)
        target.chmod(0o444)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
