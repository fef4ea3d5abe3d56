"""The store's logic on both databases: numbering, aliases, atomic publish, errors, staged
publishes, idempotent steps, deletion and pins."""

from __future__ import annotations

import hashlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, event

from modelstate.app import ALEMBIC_DIR, VERSION_TABLE
from modelstate.blobstore import PENDING_TTL_S, BlobStore
from modelstate.models import Base
from modelstate.schemas import FileRef, PublishRequest, Version, VersionKey, VersionKind
from modelstate.store import ModelStore
from services.common.db import make_sessionmaker
from services.common.errors import Conflict, InvalidInput, NotFound
from tests.conftest import migrated_engine
from tests.support.blobs import receive


@pytest.fixture
def engine(database_url: str) -> Any:
    yield from migrated_engine(database_url, ALEMBIC_DIR, VERSION_TABLE)


@pytest.fixture
def store(engine: Engine, tmp_path: Path) -> ModelStore:
    return ModelStore(make_sessionmaker(engine), BlobStore(tmp_path / "blobs", 1 << 20))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def upload(store: ModelStore, data: bytes) -> FileRef:
    blob = store.register_blob(receive(store.blobs, data))
    return FileRef(path="x", sha256=blob.sha256, size=blob.size)


def publish(
    store: ModelStore, job_id: str = "job-1", *, upload_files: bool = True, **fields: Any
) -> Version:
    """`files={"path": b"content"}` are uploaded first, then committed."""
    contents: dict[str, bytes] = fields.pop("files", {"weights": b"w"})
    refs = [FileRef(path=path, sha256=sha(data), size=len(data)) for path, data in contents.items()]
    if upload_files:
        for data in contents.values():
            upload(store, data)
    request = PublishRequest(
        job_id=job_id,
        kind=fields.pop("kind", VersionKind.lora),
        base_model="loom/tiny",
        files=refs,
        **fields,
    )
    version, _ = store.publish(request)
    return version


def test_migrations_match_the_models(empty_database_url: str) -> None:
    for engine in migrated_engine(empty_database_url, ALEMBIC_DIR, VERSION_TABLE):
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
            diff = compare_metadata(context, Base.metadata)
    assert diff == []


def test_publish_numbers_versions_and_moves_latest(store: ModelStore) -> None:
    first = publish(
        store, step=1, metrics={"loss": 1.5}, files={"adapter_config/json": b"{}", "weights": b"w1"}
    )
    second = publish(store, step=2, aliases=["best"], files={"weights": b"w2"})
    assert (first.number, first.parent, first.aliases) == (1, 0, ["latest"])
    assert (second.number, second.parent, second.aliases) == (2, 1, ["best", "latest"])
    assert first.metrics == {"loss": 1.5} and second.step == 2
    assert [f.path for f in first.files] == ["adapter_config/json", "weights"]
    assert first.files[1].sha256 == sha(b"w1")
    assert first.created_at.tzinfo is not None
    assert second.id > first.id
    assert Path(str(second.local_path), "weights").read_bytes() == b"w2"

    assert store.get_version("job-1", "latest").number == 2
    assert store.get_version("job-1", "2") == store.get_version("job-1", 2)
    assert store.get_version("job-1", 1).aliases == []
    assert [v.number for v in store.list_versions("job-1")] == [1, 2]
    assert store.list_versions("other-job") == []
    other = publish(store, "job-2", parent=0, files={"weights": b"w1"})
    assert (other.number, other.parent) == (1, 0)
    assert [v.number for v in store.versions_after(first.id, None, 10)] == [2, 1]
    assert [v.job_id for v in store.versions_after(0, "job-2", 10)] == ["job-2"]
    assert store.open_file("job-1", "latest", "weights").read_bytes() == b"w2"


def test_identical_content_is_stored_once_across_versions_and_jobs(store: ModelStore) -> None:
    publish(store, files={"a": b"same", "b": b"other"})
    publish(store, "job-2", files={"c": b"same"})
    stored = sorted(name for name, _ in store.blobs.blob_files())
    assert stored == sorted({sha(b"same"), sha(b"other")})


def test_aliases_move_explicitly_and_can_be_deleted(store: ModelStore) -> None:
    for step, data in enumerate((b"a", b"b", b"c")):
        publish(store, step=step, files={"weights": data})
    assert store.move_alias("job-1", "best", 2).number == 2
    assert store.move_alias("job-1", "latest", 1).number == 1
    assert store.get_version("job-1", "latest").number == 1
    assert store.get_version("job-1", "best").aliases == ["best"]
    # The parent of the next version defaults to what `latest` names.
    assert publish(store, files={"weights": b"d"}).parent == 1
    with pytest.raises(NotFound, match="no version 9"):
        store.move_alias("job-1", "best", 9)
    store.delete_alias("job-1", "best")
    with pytest.raises(NotFound, match="no alias 'best'"):
        store.delete_alias("job-1", "best")
    with pytest.raises(Conflict, match="'latest' is kept by the store"):
        store.delete_alias("job-1", "latest")


def test_unknown_references_say_what_exists(store: ModelStore) -> None:
    with pytest.raises(NotFound, match="has no published versions"):
        store.get_version("ghost", 1)
    publish(store, aliases=["best"], files={"weights": b"a"})
    with pytest.raises(NotFound, match=r"no version 5.*1\.\.1.*best->1, latest->1"):
        store.get_version("job-1", 5)
    with pytest.raises(NotFound, match="no alias 'nope'"):
        store.get_version("job-1", "nope")
    with pytest.raises(NotFound, match="base model"):
        store.get_version("job-1", 0)
    with pytest.raises(NotFound, match="no file 'missing'.*weights"):
        store.open_file("job-1", 1, "missing")


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"upload_files": False}, Conflict, "not in the store"),
        ({"files": {"../escape": b"y"}}, InvalidInput, "Unsafe file path"),
        ({"files": {"a": b"1", "a/b": b"2"}}, InvalidInput, "both a file and the directory"),
        ({"parent": 4}, NotFound, "no version 4"),
    ],
)
def test_bad_publish_leaves_no_version(
    store: ModelStore, fields: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        publish(store, **fields)
    assert store.list_versions("job-1") == []
    assert not (store.blobs.versions / "job-1").exists()
    assert list(store.blobs.tmp.iterdir()) == []


def test_declared_size_must_match_the_stored_blob(store: ModelStore) -> None:
    ref = upload(store, b"four")
    request = PublishRequest(
        job_id="job-1",
        kind=VersionKind.full,
        base_model="m",
        files=[FileRef(path="w", sha256=ref.sha256, size=5)],
    )
    with pytest.raises(InvalidInput, match="sizes"):
        store.publish(request)


def test_a_step_is_published_once_and_a_retry_returns_it(store: ModelStore) -> None:
    first = publish(store, step=7, files={"weights": b"w"})
    request = PublishRequest(
        job_id="job-1",
        kind=VersionKind.lora,
        base_model="loom/tiny",
        step=7,
        aliases=["best"],
        files=[FileRef(path="weights", sha256=sha(b"w"), size=1)],
    )
    again, created = store.publish(request)
    assert not created and again.number == first.number and again.aliases == ["best", "latest"]
    with pytest.raises(Conflict, match="already has version 1 for step 7 with different files"):
        publish(store, step=7, files={"weights": b"other"})
    assert [v.number for v in store.list_versions("job-1")] == [1]


def test_concurrent_publishes_of_one_step_make_one_version(store: ModelStore) -> None:
    def attempt(i: int) -> str:
        try:
            return f"v{publish(store, step=3, files={'weights': bytes([i % 2])}).number}"
        except Conflict:
            return "conflict"

    with ThreadPoolExecutor(max_workers=6) as pool:
        outcomes = list(pool.map(attempt, range(8)))
    assert [v.number for v in store.list_versions("job-1")] == [1]
    winner = store.get_version("job-1", 1).files[0].sha256
    same = [i for i in range(8) if sha(bytes([i % 2])) == winner]
    assert outcomes.count("v1") == len(same) and outcomes.count("conflict") == 8 - len(same)


def test_concurrent_publishes_get_distinct_numbers(store: ModelStore) -> None:
    def publish_step(i: int) -> int:
        return publish(store, step=i, files={"weights": str(i).encode()}).number

    with ThreadPoolExecutor(max_workers=6) as pool:
        numbers = list(pool.map(publish_step, range(12)))
    assert sorted(numbers) == list(range(1, 13))
    assert store.get_version("job-1", "latest").number == 12
    for version in store.list_versions("job-1"):  # every directory holds its own content
        assert Path(str(version.local_path), "weights").read_bytes() == str(version.step).encode()


def test_staged_directory_is_adopted_without_copying(store: ModelStore) -> None:
    name = store.blobs.new_staging_name()
    staged = store.blobs.staging / name
    (staged / "sub").mkdir()
    (staged / "sub" / "w.bin").write_bytes(b"weights")
    (staged / "config.json").write_bytes(b"{}")
    inode = (staged / "sub" / "w.bin").stat().st_ino
    declared = [FileRef(path="sub/w.bin", sha256=sha(b"weights"), size=7)]
    request = PublishRequest(
        job_id="job-1", kind=VersionKind.full, base_model="m", staged=name, files=declared
    )
    version, created = store.publish(request)
    assert created and [f.path for f in version.files] == ["config.json", "sub/w.bin"]
    assert store.blobs.blob_path(sha(b"weights")).stat().st_ino == inode  # renamed, not copied
    assert not staged.exists()

    name = store.blobs.new_staging_name()
    (store.blobs.staging / name / "w.bin").write_bytes(b"tampered")
    bad = request.model_copy(
        update={"staged": name, "files": [FileRef(path="w.bin", sha256=sha(b"weights"), size=8)]}
    )
    with pytest.raises(InvalidInput, match="declared"):
        store.publish(bad)
    with pytest.raises(NotFound, match="No staging directory"):
        store.publish(request.model_copy(update={"staged": "nope"}))


def stage(store: ModelStore, files: dict[str, bytes]) -> str:
    name = store.blobs.new_staging_name()
    for path, data in files.items():
        (store.blobs.staging / name / path).write_bytes(data)
    return name


def test_a_staged_publish_commits_once_and_a_refused_one_adds_no_blob(
    store: ModelStore, engine: Engine
) -> None:
    """The staged files join the store in the version's own transaction: one commit per
    publish, and a publish refused at commit leaves neither blob rows nor staged files."""
    commits: list[object] = []
    event.listen(engine, "commit", commits.append)
    request = PublishRequest(
        job_id="job-1",
        kind=VersionKind.full,
        base_model="m",
        step=1,
        staged=stage(store, {"w.bin": b"step one", "config.json": b"{}"}),
    )
    store.publish(request)
    assert len(commits) == 1

    name = stage(store, {"w.bin": b"step one, again", "config.json": b"{}"})
    with pytest.raises(Conflict, match="already has version 1 for step 1"):
        store.publish(request.model_copy(update={"staged": name}))
    with pytest.raises(NotFound):
        store.blob(sha(b"step one, again"))
    assert not (store.blobs.staging / name).exists()
    assert [v.number for v in store.list_versions("job-1")] == [1]
    assert store.blob(sha(b"{}")).size == 2  # content of the committed version stays


def test_delete_refuses_aliased_and_pinned_versions(store: ModelStore) -> None:
    for step in range(3):
        publish(store, step=step, files={"weights": bytes([step])})
    store.move_alias("job-1", "best", 1)
    with pytest.raises(Conflict, match=r"has aliases \['best'\]"):
        store.delete_version("job-1", 1)
    with pytest.raises(Conflict, match="latest"):
        store.delete_version("job-1", 3)
    store.set_pins("rollout@a", [VersionKey(job_id="job-1", number=2)], ttl_s=60)
    with pytest.raises(Conflict, match=r"pinned by \['rollout@a'\]"):
        store.delete_version("job-1", 2)
    assert [(p.holder, p.number) for p in store.pins()] == [("rollout@a", 2)]

    store.set_pins("rollout@a", [VersionKey(job_id="job-1", number=2)], ttl_s=0.05)
    time.sleep(0.1)  # a lease that was not renewed lapses
    assert store.pins() == []
    deleted = store.delete_version("job-1", 2)
    assert deleted.number == 2 and not Path(str(deleted.local_path)).exists()
    assert [v.number for v in store.list_versions("job-1")] == [1, 3]
    with pytest.raises(NotFound):
        store.delete_version("job-1", 2)
    # Pins of versions that are gone are dropped, not stored.
    assert store.set_pins("rollout@b", [VersionKey(job_id="job-1", number=2)], 60) == []


def test_lineage_follows_parents_until_a_gap(store: ModelStore) -> None:
    for step in range(4):
        publish(store, step=step, files={"weights": bytes([step])})
    chain, complete = store.lineage("job-1", "latest")
    assert [v.number for v in chain] == [4, 3, 2, 1] and complete
    store.delete_version("job-1", 2)
    chain, complete = store.lineage("job-1", 4)
    assert [v.number for v in chain] == [4, 3] and not complete


def test_a_staged_publish_links_its_files_for_early_readers(store: ModelStore) -> None:
    """The pending directory holds the staged files themselves; it is rebuilt for a retried
    publish, dropped when old, and a publish that is not staged has none."""
    name = store.blobs.new_staging_name()
    staged = store.blobs.staging / name
    (staged / "sub").mkdir()
    (staged / "sub" / "w.bin").write_bytes(b"weights")
    request = PublishRequest(job_id="job-1", kind=VersionKind.full, base_model="m", staged=name)
    pending = store.link_pending(request)
    assert pending is not None and store.link_pending(request) == pending  # a retry
    assert (pending.job_id, pending.kind, pending.staged) == ("job-1", VersionKind.full, name)
    assert pending.files == {"sub/w.bin": 7}
    early = Path(pending.local_path) / "sub" / "w.bin"
    assert early.stat().st_ino == (staged / "sub" / "w.bin").stat().st_ino
    version, _ = store.publish(request)
    assert early.read_bytes() == b"weights"  # still readable after the files moved
    assert Path(str(version.local_path), "sub", "w.bin").stat().st_ino == early.stat().st_ino

    old = time.time() - PENDING_TTL_S - 1
    os.utime(pending.local_path, (old, old))
    later = store.blobs.new_staging_name()
    (store.blobs.staging / later / "w.bin").write_bytes(b"more")
    assert store.link_pending(request.model_copy(update={"staged": later})) is not None
    assert Path(pending.local_path).exists()  # swept at most once every PENDING_SWEEP_S
    restarted = ModelStore(store.sessions, BlobStore(store.blobs.root, 1 << 30))
    again = restarted.blobs.new_staging_name()
    (restarted.blobs.staging / again / "w.bin").write_bytes(b"more")
    assert restarted.link_pending(request.model_copy(update={"staged": again})) is not None
    assert not Path(pending.local_path).exists()  # a store's first publish sweeps
    assert (
        store.link_pending(
            request.model_copy(
                update={
                    "staged": None,
                    "files": [FileRef(path="w.bin", sha256=sha(b"more"), size=4)],
                }
            )
        )
        is None
    )
