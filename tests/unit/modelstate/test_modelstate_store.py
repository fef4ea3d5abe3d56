"""The store's logic on both databases: numbering, aliases, atomic publish, errors."""

from __future__ import annotations

import hashlib
import io
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine

from modelstate.app import ALEMBIC_DIR, VERSION_TABLE
from modelstate.blobstore import BlobStore
from modelstate.models import Base
from modelstate.schemas import PublishRequest, VersionKind
from modelstate.store import ModelStore
from services.common.db import make_engine, make_sessionmaker, migrate
from services.common.errors import InvalidInput, NotFound


@pytest.fixture
def engine(database_url: str) -> Any:
    migrate(database_url, ALEMBIC_DIR, VERSION_TABLE)
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def store(engine: Engine, tmp_path: Path) -> ModelStore:
    return ModelStore(make_sessionmaker(engine), BlobStore(tmp_path / "blobs", 1 << 20))


def meta(job_id: str = "job-1", **fields: Any) -> PublishRequest:
    return PublishRequest(job_id=job_id, kind=VersionKind.lora, base_model="loom/tiny", **fields)


def files(**contents: bytes) -> list[tuple[str, io.BytesIO]]:
    return [(path.replace("__", "/"), io.BytesIO(data)) for path, data in contents.items()]


def test_migrations_match_the_models(engine: Engine) -> None:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        diff = compare_metadata(context, Base.metadata)
    assert diff == []


def test_publish_numbers_versions_and_moves_latest(store: ModelStore) -> None:
    first = store.publish(meta(step=1, metrics={"loss": 1.5}),
                          files(adapter_config__json=b"{}", weights=b"w1"))
    second = store.publish(meta(step=2, aliases=["best"]), files(weights=b"w2"))
    assert (first.number, first.parent, first.aliases) == (1, 0, ["latest"])
    assert (second.number, second.parent, second.aliases) == (2, 1, ["best", "latest"])
    assert first.metrics == {"loss": 1.5} and second.step == 2
    assert [f.path for f in first.files] == ["adapter_config/json", "weights"]
    assert first.files[1].sha256 == hashlib.sha256(b"w1").hexdigest()
    assert first.created_at.tzinfo is not None
    assert second.id > first.id
    assert Path(str(second.local_path), "weights").read_bytes() == b"w2"

    assert store.get_version("job-1", "latest").number == 2
    assert store.get_version("job-1", "2") == store.get_version("job-1", 2)
    assert store.get_version("job-1", 1).aliases == []
    assert [v.number for v in store.list_versions("job-1")] == [1, 2]
    assert store.list_versions("other-job") == []
    other = store.publish(meta("job-2", parent=0), files(weights=b"w1"))
    assert (other.number, other.parent) == (1, 0)
    assert [v.number for v in store.versions_after(first.id, None, 10)] == [2, 1]
    assert [v.job_id for v in store.versions_after(0, "job-2", 10)] == ["job-2"]
    assert store.open_file("job-1", "latest", "weights").read_bytes() == b"w2"


def test_aliases_move_explicitly(store: ModelStore) -> None:
    for data in (b"a", b"b", b"c"):
        store.publish(meta(), files(weights=data))
    assert store.move_alias("job-1", "best", 2).number == 2
    assert store.move_alias("job-1", "latest", 1).number == 1
    assert store.get_version("job-1", "latest").number == 1
    assert store.get_version("job-1", "best").aliases == ["best"]
    # The parent of the next version defaults to what `latest` names.
    assert store.publish(meta(), files(weights=b"d")).parent == 1
    with pytest.raises(NotFound, match="no version 9"):
        store.move_alias("job-1", "best", 9)
    assert store.get_version("job-1", "best").number == 2


def test_unknown_references_say_what_exists(store: ModelStore) -> None:
    with pytest.raises(NotFound, match="has no published versions"):
        store.get_version("ghost", 1)
    store.publish(meta(aliases=["best"]), files(weights=b"a"))
    with pytest.raises(NotFound, match=r"no version 5.*1\.\.1.*best->1, latest->1"):
        store.get_version("job-1", 5)
    with pytest.raises(NotFound, match="no alias 'nope'"):
        store.get_version("job-1", "nope")
    with pytest.raises(NotFound, match="base model"):
        store.get_version("job-1", 0)
    with pytest.raises(NotFound, match="no file 'missing'.*weights"):
        store.open_file("job-1", 1, "missing")


@pytest.mark.parametrize(
    ("request_meta", "uploads", "message"),
    [
        (meta(sha256={"weights": "0" * 64}), files(weights=b"x"), "declared sha256"),
        (meta(sha256={"other": "0" * 64}), files(weights=b"x"), "not uploaded"),
        (meta(), files(weights=b"x") + [("../escape", io.BytesIO(b"y"))], "Unsafe file path"),
        (meta(), [], "at least one file"),
        (meta(parent=4), files(weights=b"x"), "no version 4"),
    ],
)
def test_bad_publish_leaves_no_version(
    store: ModelStore, request_meta: PublishRequest, uploads: list[Any], message: str
) -> None:
    with pytest.raises((InvalidInput, NotFound), match=message):
        store.publish(request_meta, uploads)
    assert store.list_versions("job-1") == []
    assert not (store.blobs.versions / "job-1").exists()
    assert list(store.blobs.tmp.iterdir()) == []


def test_declared_hashes_are_verified(store: ModelStore) -> None:
    digest = hashlib.sha256(b"x").hexdigest()
    version = store.publish(meta(sha256={"weights": digest.upper()}), files(weights=b"x"))
    assert version.files[0].sha256 == digest


def test_concurrent_publishes_get_distinct_numbers(store: ModelStore) -> None:
    def publish(i: int) -> int:
        return store.publish(meta(step=i), files(weights=str(i).encode())).number

    with ThreadPoolExecutor(max_workers=6) as pool:
        numbers = list(pool.map(publish, range(12)))
    assert sorted(numbers) == list(range(1, 13))
    assert store.get_version("job-1", "latest").number == 12
    versions = store.list_versions("job-1")
    for version in versions:  # every number's directory holds its own content
        step = version.step
        assert Path(str(version.local_path), "weights").read_bytes() == str(step).encode()
