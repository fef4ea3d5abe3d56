"""Content-addressed blobs and version directories on disk."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import pytest

from modelstate.blobstore import BlobStore, check_manifest_paths, check_relative_path
from services.common.errors import InvalidInput, PayloadTooLarge


@pytest.fixture
def blobs(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "blobs", max_file_bytes=1 << 20)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_put_is_content_addressed_and_stores_identical_content_once(blobs: BlobStore) -> None:
    data = os.urandom(3 * (1 << 18))
    first = blobs.put(io.BytesIO(data), label="a")
    second = blobs.put(io.BytesIO(data), label="b", expected_sha256=sha(data).upper())
    assert first == second
    assert first.sha256 == sha(data) and first.size == len(data)
    path = blobs.blob_path(first.sha256)
    assert path == blobs.root / "sha256" / first.sha256[:2] / first.sha256
    assert path.read_bytes() == data
    assert path.stat().st_mode & 0o222 == 0
    assert list(blobs.tmp.iterdir()) == []


def test_wrong_declared_hash_is_rejected_and_leaves_nothing(blobs: BlobStore) -> None:
    with pytest.raises(InvalidInput, match="declared sha256"):
        blobs.put(io.BytesIO(b"payload"), label="w.bin", expected_sha256="0" * 64)
    assert list(blobs.tmp.iterdir()) == []
    assert not blobs.blob_path(sha(b"payload")).exists()


def test_file_over_the_size_limit_is_rejected(tmp_path: Path) -> None:
    small = BlobStore(tmp_path / "blobs", max_file_bytes=10)
    with pytest.raises(PayloadTooLarge):
        small.put(io.BytesIO(b"x" * 11), label="big")
    assert list(small.tmp.iterdir()) == []
    assert small.put(io.BytesIO(b"x" * 10), label="fits").size == 10


@pytest.mark.parametrize(
    "path", ["", "/etc/passwd", "../up", "a/../../b", "a\\b", "a//b", "./a", "a/.", "a\x00b"]
)
def test_unsafe_paths_are_rejected(path: str) -> None:
    with pytest.raises(InvalidInput, match="Unsafe file path"):
        check_relative_path(path)


def test_manifest_paths_must_be_distinct_and_not_nest_in_files() -> None:
    check_manifest_paths(["config.json", "sub/model.safetensors", "sub/other"])
    with pytest.raises(InvalidInput, match="twice"):
        check_manifest_paths(["a", "a"])
    with pytest.raises(InvalidInput, match="both a file and the directory"):
        check_manifest_paths(["sub", "sub/x"])


def test_materialize_links_blobs_into_a_version_directory(blobs: BlobStore) -> None:
    config = blobs.put(io.BytesIO(b"{}"), label="config.json")
    weights = blobs.put(io.BytesIO(b"weights"), label="w")
    # A directory left by a publish that crashed before its commit is replaced.
    stale = blobs.version_dir("job", 1)
    stale.mkdir(parents=True)
    (stale / "junk").write_text("x")
    directory = blobs.materialize(
        "job", 1, {"config.json": config.sha256, "shards/w.safetensors": weights.sha256}
    )
    assert directory == stale
    assert sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*")
                  if p.is_file()) == ["config.json", "shards/w.safetensors"]
    linked = directory / "shards" / "w.safetensors"
    assert linked.read_bytes() == b"weights"
    assert linked.stat().st_ino == blobs.blob_path(weights.sha256).stat().st_ino
    assert list(blobs.tmp.iterdir()) == []


def test_materialize_refuses_unsafe_paths_without_leaving_a_directory(blobs: BlobStore) -> None:
    blob = blobs.put(io.BytesIO(b"x"), label="x")
    with pytest.raises(InvalidInput):
        blobs.materialize("job", 1, {"../escape": blob.sha256})
    assert not blobs.version_dir("job", 1).exists()
    assert list(blobs.tmp.iterdir()) == []
