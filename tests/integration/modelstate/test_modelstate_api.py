"""The model-state HTTP API in-process (httpx2.ASGITransport), on both databases, through the
real client and through raw requests for malformed input."""

from __future__ import annotations

import asyncio
import hashlib
import io
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastapi import FastAPI

from modelstate.app import create_app
from modelstate.client import ModelStateClient, local_or_download
from modelstate.schemas import VersionKey, VersionKind, VersionMeta
from modelstate.settings import ModelStateSettings
from services.common.errors import Conflict, InvalidInput, NotFound, UpstreamError
from services.common.service_token import service_headers


@pytest.fixture
async def app(database_url: str, tmp_path: Path) -> AsyncIterator[FastAPI]:
    settings = ModelStateSettings(data_dir=tmp_path / "data", database_url=database_url)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        yield app


@pytest.fixture
async def http(app: FastAPI) -> AsyncIterator[httpx2.AsyncClient]:
    transport = httpx2.ASGITransport(app=app)
    async with httpx2.AsyncClient(
        transport=transport,
        base_url="http://modelstate",
        headers=service_headers(app.state.settings),
    ) as client:
        yield client


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[ModelStateClient]:
    client = ModelStateClient(
        "http://modelstate",
        transport=httpx2.ASGITransport(app=app),
        headers=service_headers(app.state.settings),
    )
    yield client
    await client.aclose()


def publish_meta(job_id: str = "job-1", **fields: Any) -> VersionMeta:
    return VersionMeta(job_id=job_id, kind=VersionKind.full, base_model="loom/tiny", **fields)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_dir(directory: Path, **files: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return directory


def assert_error(response: httpx2.Response, status: int, text: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert text in error["message"], error


async def test_publish_a_model_directory_and_read_it_back(
    client: ModelStateClient, app: FastAPI, tiny_model_dir: Path, tmp_path: Path
) -> None:
    version = await client.publish(publish_meta(step=3, metrics={"reward": 0.5}), tiny_model_dir)
    expected = sorted(
        p.relative_to(tiny_model_dir).as_posix() for p in tiny_model_dir.rglob("*") if p.is_file()
    )
    assert [f.path for f in version.files] == expected
    weights = next(f for f in version.files if f.path == "model.safetensors")
    source = (tiny_model_dir / "model.safetensors").read_bytes()
    assert weights.sha256 == hashlib.sha256(source).hexdigest()
    assert (version.number, version.aliases, version.step) == (1, ["latest"], 3)

    assert await client.get_version("job-1", "latest") == version
    assert await client.list_versions("job-1") == [version]
    assert await client.list_versions("no-such-job") == []

    # The store's directory is on this host: engines read it in place.
    assert await local_or_download(version, tmp_path / "cache", client=client) == Path(
        str(version.local_path)
    )
    copy = await client.download(version, tmp_path / "copy")
    assert (copy / "model.safetensors").read_bytes() == source
    remote_view = version.model_copy(update={"local_path": "/elsewhere/on/another/host"})
    cached = await local_or_download(remote_view, tmp_path / "cache", client=client)
    assert cached == tmp_path / "cache" / "job-1" / "1"
    assert (cached / "config.json").read_bytes() == (tiny_model_dir / "config.json").read_bytes()

    from transformers import AutoConfig  # the published directory is a normal HF model dir

    assert AutoConfig.from_pretrained(str(version.local_path)).hidden_size == 128


async def test_aliases_over_http(
    client: ModelStateClient, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_model.safetensors").write_bytes(b"a1")
    await client.publish(publish_meta(), tmp_path / "adapter")
    (tmp_path / "adapter" / "adapter_model.safetensors").write_bytes(b"a2")
    await client.publish(publish_meta(aliases=["candidate"]), tmp_path / "adapter")

    response = await http.put("/v1/jobs/job-1/aliases/best", json={"number": 1})
    assert response.status_code == 200 and response.json() == {
        "job_id": "job-1",
        "name": "best",
        "number": 1,
    }
    assert (await client.get_version("job-1", "best")).number == 1
    assert (await client.get_version("job-1", "candidate")).aliases == ["candidate", "latest"]
    file = await http.get("/v1/jobs/job-1/versions/best/files/adapter_model.safetensors")
    assert file.status_code == 200 and file.content == b"a1"


async def test_concurrent_publishes_over_http(client: ModelStateClient, tmp_path: Path) -> None:
    directories = []
    for i in range(5):
        directory = tmp_path / f"v{i}"
        directory.mkdir()
        (directory / "weights").write_bytes(bytes([i]) * 1000)
        directories.append(directory)
    versions = await asyncio.gather(
        *(client.publish(publish_meta(step=i), d) for i, d in enumerate(directories))
    )
    assert sorted(v.number for v in versions) == [1, 2, 3, 4, 5]


async def assert_nothing_published(http: httpx2.AsyncClient, app: FastAPI) -> None:
    assert (await http.get("/v1/jobs/job-1/versions")).json() == {"versions": []}
    versions_dir = app.state.store.blobs.versions
    assert list(versions_dir.iterdir()) == []
    assert list(app.state.store.blobs.tmp.iterdir()) == []


META = {"job_id": "job-1", "kind": "full", "base_model": "m"}
X = {"path": "w", "sha256": sha(b"x"), "size": 1}


@pytest.mark.parametrize(
    ("body", "status", "text"),
    [
        ({**META, "files": [X], "colour": "red"}, 422, "Extra inputs are not permitted"),
        ({**META, "kind": "sideways", "files": [X]}, 422, "kind"),
        ({**META, "job_id": "../job", "files": [X]}, 422, "job_id"),
        (META, 422, "a version needs files"),
        ({**META, "files": [{**X, "sha256": "XY"}]}, 422, "sha256"),
        ({**META, "files": [{**X, "path": "../../etc/passwd"}]}, 422, "Unsafe file path"),
        ({**META, "files": [{**X, "path": "/abs"}]}, 422, "Unsafe file path"),
        ({**META, "files": [X, X]}, 422, "appears twice"),
        ({**META, "files": [{**X, "size": 2}]}, 422, "sizes"),
        ({**META, "files": [{**X, "sha256": sha(b"never uploaded")}]}, 409, "not in the store"),
        ({**META, "files": [X], "parent": 3}, 404, "no version 3"),
        ({**META, "staged": "no-such-dir"}, 404, "No staging directory"),
        ({**META, "staged": "../../etc"}, 422, "staged"),
    ],
)
async def test_bad_publish_is_a_clear_4xx_and_publishes_nothing(
    http: httpx2.AsyncClient,
    app: FastAPI,
    body: dict[str, Any],
    status: int,
    text: str,
) -> None:
    assert (await http.put(f"/v1/blobs/{sha(b'x')}", content=b"x")).status_code == 201
    assert_error(await http.post("/v1/versions", json=body), status, text)
    await assert_nothing_published(http, app)


@pytest.mark.parametrize(
    ("content", "headers", "status", "text"),
    [
        (b"not x", {}, 422, "declared sha256"),
        (b"x", {"Content-Length": "5"}, 422, "truncated"),
    ],
)
async def test_bad_blob_upload_is_a_clear_4xx_and_stores_nothing(
    http: httpx2.AsyncClient,
    app: FastAPI,
    content: bytes,
    headers: dict[str, str],
    status: int,
    text: str,
) -> None:
    response = await http.put(f"/v1/blobs/{sha(b'x')}", content=content, headers=headers)
    assert_error(response, status, text)
    assert_error(await http.get(f"/v1/blobs/{sha(b'x')}"), 404, "upload it")
    assert_error(await http.put("/v1/blobs/ABC", content=b"x"), 422, "sha256")
    await assert_nothing_published(http, app)


async def test_upload_skips_stored_content_and_a_step_republish_is_idempotent(
    client: ModelStateClient, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    first = await client.publish(publish_meta(step=1), write_dir(tmp_path / "a", w=b"x", c=b"c"))
    assert await client.has_blob(sha(b"x"))
    again = await http.put(f"/v1/blobs/{sha(b'x')}", content=b"x")
    assert again.status_code == 200 and again.json() == {"sha256": sha(b"x"), "size": 1}
    retry = await http.post(
        "/v1/versions",
        json={
            **META,
            "job_id": "job-1",
            "kind": "full",
            "base_model": "loom/tiny",
            "step": 1,
            "files": [f.model_dump() for f in first.files],
        },
    )
    assert retry.status_code == 200 and retry.json()["number"] == first.number
    changed = write_dir(tmp_path / "b", w=b"y", c=b"c")
    with pytest.raises(Conflict, match="step 1 with different files"):
        await client.publish(publish_meta(step=1), changed)
    second = await client.publish(publish_meta(step=2), changed)
    diff = (await http.get("/v1/jobs/job-1/compare", params={"a": 1, "b": "latest"})).json()
    assert [c["path"] for c in diff["changed"]] == ["w"] and diff["unchanged"] == ["c"]
    assert diff["shared_bytes"] == 1 and (diff["a"], diff["b"]) == (1, second.number)


async def test_staged_publish_through_the_client_moves_no_bytes(
    client: ModelStateClient, app: FastAPI
) -> None:
    directory = await client.staging_dir()
    assert directory is not None and directory.parent == app.state.store.blobs.staging
    write_dir(directory, **{"model.safetensors": b"weights", "config.json": b"{}"})
    inode = (directory / "model.safetensors").stat().st_ino
    version = await client.publish(
        publish_meta(step=5), directory, hashes={"model.safetensors": sha(b"weights")}
    )
    assert not directory.exists() and version.step == 5
    stored = Path(str(version.local_path), "model.safetensors")
    assert stored.read_bytes() == b"weights" and stored.stat().st_ino == inode
    bad = write_dir(await client.staging_dir() or Path("/nonexistent"), w=b"abc")
    with pytest.raises(InvalidInput, match="declared"):
        await client.publish(publish_meta(step=6), bad, hashes={"w": sha(b"xyz")})


async def test_delete_pins_retention_and_gc_over_http(
    client: ModelStateClient, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    for step in range(4):
        await client.publish(
            publish_meta(step=step), write_dir(tmp_path / f"{step}", w=bytes([step]))
        )
    await client.set_pins("rollout@127.0.0.1:8001", [VersionKey(job_id="job-1", number=2)], 60)
    assert_error(await http.delete("/v1/jobs/job-1/versions/2"), 409, "pinned by")
    assert_error(await http.delete("/v1/jobs/job-1/versions/4"), 409, "aliases ['latest']")
    assert_error(await http.delete("/v1/jobs/job-1/versions/9"), 404, "no version 9")
    assert_error(await http.delete("/v1/jobs/job-1/versions/0"), 422, "number")
    deleted = await http.delete("/v1/jobs/job-1/versions/1")
    assert deleted.status_code == 200 and deleted.json()["number"] == 1
    pins = (await http.get("/v1/pins")).json()["pins"]
    assert [(p["holder"], p["number"]) for p in pins] == [("rollout@127.0.0.1:8001", 2)]
    assert_error(await http.put("/v1/pins/bad holder", json={"versions": []}), 422, "holder")

    policy = await http.put("/v1/jobs/job-1/retention", json={"keep_last": 1})
    assert policy.json() == {
        "job_id": "job-1",
        "keep_last": 1,
        "keep_ancestors": False,
        "is_default": False,
    }
    assert_error(
        await http.put("/v1/jobs/job-1/retention", json={"keep_last": -1}), 422, "keep_last"
    )
    report = (await http.post("/v1/gc", params={"grace_s": 0})).json()
    assert report["versions_deleted"] == ["job-1@3"] and report["blobs_deleted"] == 2
    assert [v.number for v in await client.list_versions("job-1")] == [2, 4]
    lineage = (await http.get("/v1/jobs/job-1/versions/4/lineage")).json()
    assert [v["number"] for v in lineage["versions"]] == [4] and not lineage["complete"]
    assert (await http.delete("/v1/pins/rollout@127.0.0.1:8001")).status_code == 204
    assert (await http.get("/v1/pins")).json() == {"pins": []}


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "text"),
    [
        ("GET", "/v1/jobs/job-1/compare?a=1", None, 422, "b"),
        ("GET", "/v1/jobs/job-1/compare?a=1&b=nope", None, 404, "no alias 'nope'"),
        ("GET", "/v1/jobs/job-1/versions/7/lineage", None, 404, "no version 7"),
        ("GET", "/v1/jobs/job-1/versions/1/archive?merge_lora=maybe", None, 422, "merge_lora"),
        ("POST", "/v1/gc?grace_s=-1", None, 422, "grace_s"),
        ("POST", "/v1/gc?grace_s=1e17", None, 422, "grace_s"),
        ("PUT", "/v1/pins/rollout@h:1", {"versions": [], "ttl_s": 0}, 422, "ttl_s"),
        (
            "PUT",
            "/v1/pins/rollout@h:1",
            {"versions": [{"job_id": "job-1", "number": 1}] * 1025},
            422,
            "versions",
        ),
        ("PUT", "/v1/jobs/-bad/retention", {"keep_last": 1}, 422, "job_id"),
        ("DELETE", "/v1/jobs/job-1/aliases/nope", None, 404, "no alias 'nope'"),
        ("DELETE", "/v1/jobs/job-1/aliases/latest", None, 409, "kept by the store"),
        # Past the INTEGER column, and digits int() refuses (found by schemathesis: 500s).
        ("GET", "/v1/jobs/job-1/versions/99999999999999999999", None, 404, "go up to"),
        ("DELETE", "/v1/jobs/job-1/versions/2147483648", None, 404, "go up to"),
        ("GET", "/v1/jobs/job-1/versions/%C2%B2", None, 404, "no alias '²'"),
        ("PUT", "/v1/jobs/job-1/aliases/best", {"number": 2**31}, 422, "number"),
        (
            "PUT",
            "/v1/pins/rollout@h:1",
            {"versions": [{"job_id": "job-1", "number": 2**40}]},
            422,
            "number",
        ),
    ],
)
async def test_malformed_version_requests_are_clear_4xx(
    client: ModelStateClient,
    http: httpx2.AsyncClient,
    tmp_path: Path,
    method: str,
    path: str,
    body: Any,
    status: int,
    text: str,
) -> None:
    await client.publish(publish_meta(), write_dir(tmp_path / "v", w=b"x"))
    assert_error(await http.request(method, path, json=body), status, text)


async def test_merging_onto_a_base_this_host_lacks_is_a_clear_4xx(
    client: ModelStateClient, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    meta = VersionMeta(job_id="job-1", kind=VersionKind.lora, base_model="/gone/base-model")
    await client.publish(meta, write_dir(tmp_path / "a", **{"adapter_config.json": b"{}"}))
    assert_error(
        await http.get("/v1/jobs/job-1/versions/1/archive", params={"merge_lora": True}),
        422,
        "does not exist",
    )


async def test_archive_streams_the_version_as_a_tar(
    client: ModelStateClient, http: httpx2.AsyncClient, tiny_model_dir: Path
) -> None:
    version = await client.publish(publish_meta(), tiny_model_dir)
    response = await http.get("/v1/jobs/job-1/versions/latest/archive")
    assert response.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(response.content)) as archive:
        names = sorted(archive.getnames())
        weights = archive.extractfile("job-1-v1/model.safetensors")
        assert weights is not None
        assert weights.read() == (tiny_model_dir / "model.safetensors").read_bytes()
    assert names == sorted(f"job-1-v1/{f.path}" for f in version.files)
    assert_error(
        await http.get("/v1/jobs/job-1/versions/1/archive", params={"merge_lora": True}),
        422,
        "only LoRA versions",
    )


async def test_unknown_things_are_404(
    http: httpx2.AsyncClient, client: ModelStateClient, tmp_path: Path
) -> None:
    assert_error(await http.get("/v1/jobs/ghost/versions/1"), 404, "no published versions")
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "w").write_bytes(b"x")
    await client.publish(publish_meta(), tmp_path / "one")
    assert_error(await http.get("/v1/jobs/job-1/versions/7"), 404, "numbers 1..1")
    assert_error(await http.get("/v1/jobs/job-1/versions/best"), 404, "no alias 'best'")
    assert_error(await http.get("/v1/jobs/job-1/versions/1/files/nope"), 404, "no file 'nope'")
    assert_error(
        await http.put("/v1/jobs/job-1/aliases/best", json={"number": 2}), 404, "no version 2"
    )
    with pytest.raises(NotFound, match="no alias"):
        await client.get_version("job-1", "best")


async def test_malformed_alias_and_event_requests_are_422(http: httpx2.AsyncClient) -> None:
    assert_error(await http.put("/v1/jobs/job-1/aliases/best", json={"number": 0}), 422, "number")
    assert_error(await http.put("/v1/jobs/job-1/aliases/best", json={"num": 1}), 422, "number")
    assert_error(await http.put("/v1/jobs/job-1/aliases/9lives", json={"number": 1}), 422, "name")
    assert_error(await http.get("/v1/events", params={"after": -1}), 422, "after")
    assert_error(await http.get("/v1/events", params={"job_id": "a/../b"}), 422, "job_id")
    assert_error(await http.get("/v1/events", headers={"Last-Event-ID": "x"}), 422, "last-event-id")


async def test_client_rejects_bad_input_before_sending(
    client: ModelStateClient, tmp_path: Path
) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidInput, match="no files"):
        await client.publish(publish_meta(), tmp_path / "empty")


async def test_readiness_checks_the_database(http: httpx2.AsyncClient) -> None:
    response = await http.get("/readyz")
    assert response.status_code == 200 and response.json()["detail"] == {"database": "ok"}


async def test_file_over_the_size_limit_is_413(tmp_path: Path) -> None:
    settings = ModelStateSettings(
        data_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/m.db", modelstate_max_file_bytes=4
    )
    app = create_app(settings)
    transport = httpx2.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(
            transport=transport, base_url="http://modelstate", headers=service_headers(settings)
        ) as http,
    ):
        assert_error(
            await http.put(f"/v1/blobs/{sha(b'12345')}", content=b"12345"), 413, "over the limit"
        )
        chunked = http.put(f"/v1/blobs/{sha(b'12345')}", content=chunks(b"123", b"45"))
        assert_error(await chunked, 413, "larger than the limit")
        await assert_nothing_published(http, app)


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def test_download_refuses_a_file_that_does_not_match_its_hash(
    client: ModelStateClient, app: FastAPI, tmp_path: Path
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "w").write_bytes(b"original")
    version = await client.publish(publish_meta(), tmp_path / "src")
    blob = app.state.store.blobs.blob_path(version.files[0].sha256)
    blob.chmod(0o644)
    blob.write_bytes(b"bitrot!!")  # same size, different content
    with pytest.raises(UpstreamError, match="arrived corrupted"):
        await client.download(version, tmp_path / "dest")
    assert list((tmp_path / "dest").iterdir()) == []
