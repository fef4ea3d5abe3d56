"""Content-addressed blobs and version directories on disk."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from modelstate import blobstore
from modelstate.blobstore import (
    BlobStore,
    ReceivedBlob,
    check_manifest_paths,
    check_relative_path,
)
from services.common.errors import InvalidInput, PayloadTooLarge
from tests.support.blobs import receive


@pytest.fixture
def blobs(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "blobs", max_file_bytes=1 << 20)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def put(blobs: BlobStore, data: bytes) -> ReceivedBlob:
    received = receive(blobs, data)
    blobs.adopt_all([received])
    return received


def test_received_content_is_adopted_once_under_its_hash(blobs: BlobStore) -> None:
    data = os.urandom(3 * (1 << 18))
    first = put(blobs, data)
    second = receive(blobs, data, expected_sha256=sha(data).upper())
    assert (first.sha256, first.size) == (second.sha256, second.size) == (sha(data), len(data))
    blobs.adopt_all([second])  # already stored: the duplicate is dropped
    path = blobs.blob_path(first.sha256)
    assert path == blobs.root / "sha256" / first.sha256[:2] / first.sha256
    assert path.read_bytes() == data
    assert path.stat().st_mode & 0o222 == 0
    assert list(blobs.tmp.iterdir()) == []


def test_wrong_declared_hash_or_size_is_rejected_and_leaves_nothing(blobs: BlobStore) -> None:
    with pytest.raises(InvalidInput, match="declared sha256"):
        receive(blobs, b"payload", expected_sha256="0" * 64)
    writer = blobs.writer("w.bin")
    writer.write(b"half")
    with pytest.raises(InvalidInput, match="truncated"):
        writer.finish(expected_size=8)
    writer.abort()
    assert list(blobs.tmp.iterdir()) == []
    assert not blobs.blob_path(sha(b"payload")).exists()


def test_file_over_the_size_limit_is_rejected(tmp_path: Path) -> None:
    small = BlobStore(tmp_path / "blobs", max_file_bytes=10)
    with pytest.raises(PayloadTooLarge):
        receive(small, b"x" * 11)
    assert list(small.tmp.iterdir()) == []
    assert receive(small, b"x" * 10).size == 10


def test_instance_id_survives_a_restart_and_staging_lists_regular_files(tmp_path: Path) -> None:
    first = BlobStore(tmp_path / "blobs", 1 << 20)
    assert BlobStore(tmp_path / "blobs", 1 << 20).instance_id == first.instance_id
    name = first.new_staging_name()
    (first.staging / name / "d").mkdir()
    (first.staging / name / "d" / "f").write_bytes(b"x")
    assert [p for p, _ in first.staged_files(name)] == ["d/f"]
    (first.staging / name / "link").symlink_to("/etc/passwd")
    with pytest.raises(InvalidInput, match="not a regular file"):
        first.staged_files(name)


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
    config = put(blobs, b"{}")
    weights = put(blobs, b"weights")
    # A directory left by a publish that crashed before its commit is replaced.
    stale = blobs.version_dir("job", 1)
    stale.mkdir(parents=True)
    (stale / "junk").write_text("x")
    directory = blobs.materialize(
        "job", 1, {"config.json": config.sha256, "shards/w.safetensors": weights.sha256}
    )
    assert directory == stale
    assert sorted(
        p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()
    ) == ["config.json", "shards/w.safetensors"]
    linked = directory / "shards" / "w.safetensors"
    assert linked.read_bytes() == b"weights"
    assert linked.stat().st_ino == blobs.blob_path(weights.sha256).stat().st_ino
    assert list(blobs.tmp.iterdir()) == []


def test_materialize_refuses_unsafe_paths_without_leaving_a_directory(blobs: BlobStore) -> None:
    blob = put(blobs, b"x")
    with pytest.raises(InvalidInput):
        blobs.materialize("job", 1, {"../escape": blob.sha256})
    assert not blobs.version_dir("job", 1).exists()
    assert list(blobs.tmp.iterdir()) == []


def test_staged_content_the_store_holds_is_not_synced_until_it_must_be_adopted(
    blobs: BlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A staged file whose content is stored already is dropped at adoption, so hashing it
    skips its fsync; should that content be collected before adoption, the file is synced
    before it becomes the blob."""
    synced: list[int | Path] = []
    monkeypatch.setattr(blobstore.os, "fsync", synced.append)
    monkeypatch.setattr(blobstore, "fsync_path", synced.append)
    staged = blobs.staging / blobs.new_staging_name()
    (staged / "new.bin").write_bytes(b"new content")
    (staged / "known.bin").write_bytes(b"known content")
    known = sha(b"known content")

    new = blobstore.hash_staged(staged / "new.bin", stored=lambda digest: digest == known)
    assert (new.sha256, new.size, new.synced) == (sha(b"new content"), 11, True)
    assert len(synced) == 1
    held = blobstore.hash_staged(staged / "known.bin", stored=lambda digest: digest == known)
    assert (held.sha256, held.synced) == (known, False)
    assert len(synced) == 1  # no fsync for content the store holds

    synced.clear()
    blobs.adopt_all([new, held])  # `known` was not in fact stored (collected meanwhile)
    assert staged / "known.bin" in synced  # synced before it became the blob
    assert staged / "new.bin" not in synced
    assert blobs.blob_path(known).read_bytes() == b"known content"
