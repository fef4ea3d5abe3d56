"""Retention rules (pure) and garbage collection against a real store on both databases."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modelstate.gc import Collector, versions_to_delete
from modelstate.schemas import ManifestFile, RetentionPolicy, Version, VersionKey, VersionKind
from modelstate.store import ModelStore
from tests.support.blobs import receive
from tests.unit.modelstate.test_modelstate_store import engine, publish, sha, store  # noqa: F401

KEEP_ALL = RetentionPolicy(keep_last=0)


def version(number: int, parent: int | None = None, aliases: list[str] | None = None) -> Version:
    return Version(
        id=number,
        job_id="j",
        number=number,
        parent=number - 1 if parent is None else parent,
        step=number,
        kind=VersionKind.full,
        base_model="m",
        metrics={},
        aliases=aliases or [],
        created_at=datetime.now(UTC),
        files=[ManifestFile(path="w", size=1, sha256="0" * 64)],
    )


def test_retention_keeps_newest_aliased_pinned_and_optionally_ancestors() -> None:
    chain = [version(n) for n in range(1, 9)]
    chain[2] = version(3, aliases=["best"])
    assert versions_to_delete(chain, KEEP_ALL, set()) == []
    assert versions_to_delete(chain, RetentionPolicy(keep_last=2), {5}) == [1, 2, 4, 6]
    with_ancestors = RetentionPolicy(keep_last=2, keep_ancestors=True)
    assert versions_to_delete(chain, with_ancestors, set()) == [4, 5, 6]


@given(
    st.lists(st.booleans(), min_size=1, max_size=30),
    st.integers(0, 10),
    st.sets(st.integers(1, 30)),
    st.booleans(),
)
def test_retention_never_deletes_what_it_must_keep(
    aliased: list[bool], keep_last: int, pinned: set[int], ancestors: bool
) -> None:
    versions = [version(n + 1, aliases=["a"] if flag else []) for n, flag in enumerate(aliased)]
    doomed = set(
        versions_to_delete(
            versions, RetentionPolicy(keep_last=keep_last, keep_ancestors=ancestors), pinned
        )
    )
    numbers = [v.number for v in versions]
    assert not doomed & pinned
    assert not doomed & {v.number for v in versions if v.aliases}
    if keep_last:
        assert not doomed & set(numbers[-keep_last:])
        if ancestors and any(aliased):  # the whole chain below the newest alias survives
            newest_alias = max(v.number for v in versions if v.aliases)
            assert not doomed & set(range(1, newest_alias + 1))
    else:
        assert not doomed


@pytest.fixture
def collector(store: ModelStore) -> Collector:  # noqa: F811
    return Collector(store, KEEP_ALL, grace_s=3600)


def test_collection_applies_policies_and_frees_unreferenced_blobs(
    store: ModelStore,  # noqa: F811
    collector: Collector,  # noqa: F811
) -> None:
    for step in range(5):
        publish(store, step=step, files={"shared": b"tokenizer", "w": f"w{step}".encode()})
    store.move_alias("job-1", "best", 2)
    store.set_pins("rollout@x", [VersionKey(job_id="job-1", number=1)], ttl_s=60)
    assert collector.retention("job-1").is_default
    assert collector.set_retention("job-1", RetentionPolicy(keep_last=1)).keep_last == 1

    report = collector.collect(grace_s=0)
    assert report.versions_deleted == ["job-1@3", "job-1@4"]
    assert [v.number for v in store.list_versions("job-1")] == [1, 2, 5]
    assert report.blobs_deleted == 2 and report.bytes_freed == 4
    stored = {name for name, _ in store.blobs.blob_files()}
    assert sha(b"w3") not in stored and sha(b"tokenizer") in stored and sha(b"w1") in stored
    assert collector.collect(grace_s=0).blobs_deleted == 0  # nothing left to do


def test_young_unreferenced_blobs_survive_collection(
    store: ModelStore,  # noqa: F811
    collector: Collector,  # noqa: F811
) -> None:
    """A blob uploaded for a publish that has not committed yet is left alone."""
    store.register_blob(receive(store.blobs, b"in flight"))
    assert collector.collect().blobs_deleted == 0
    assert collector.collect(grace_s=0).blobs_deleted == 1
    assert list(store.blobs.blob_files()) == []


def test_collection_sweeps_what_crashes_leave(
    store: ModelStore,  # noqa: F811
    collector: Collector,  # noqa: F811
) -> None:
    blobs = store.blobs
    (blobs.tmp / "blob-dead").write_bytes(b"half an upload")
    abandoned = blobs.staging / blobs.new_staging_name()
    (abandoned / "w").write_bytes(b"never published")
    orphan = blobs.blob_path(sha(b"no row"))
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"no row")  # renamed into place, then the store died before commit
    stray_dir = blobs.version_dir("job-1", 7)
    stray_dir.mkdir(parents=True)
    kept = publish(store, files={"w": b"kept"})

    young = collector.collect()
    assert (young.temp_entries_removed, young.stray_entries_removed) == (0, 0)
    old = os.path.getmtime(orphan) - 7200
    for path in (blobs.tmp / "blob-dead", abandoned, abandoned / "w", orphan, stray_dir):
        os.utime(path, (old, old))
    report = collector.collect()
    assert (report.temp_entries_removed, report.stray_entries_removed) == (2, 2)
    assert not orphan.exists() and not stray_dir.exists() and not abandoned.exists()
    assert (blobs.staging / ".loom-store-id").exists()
    assert Path(str(kept.local_path), "w").read_bytes() == b"kept"
