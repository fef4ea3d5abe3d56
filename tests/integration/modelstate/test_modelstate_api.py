"""The model-state HTTP API in-process (httpx.ASGITransport), on both databases, through the
real client and through raw requests for malformed input."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from modelstate.app import create_app
from modelstate.client import ModelStateClient, local_or_download
from modelstate.schemas import PublishRequest, VersionKind
from modelstate.settings import ModelStateSettings
from services.common.errors import InvalidInput, NotFound, UpstreamError


@pytest.fixture
async def app(database_url: str, tmp_path: Path) -> AsyncIterator[FastAPI]:
    settings = ModelStateSettings(data_dir=tmp_path / "data", database_url=database_url)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        yield app


@pytest.fixture
async def http(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://modelstate") as client:
        yield client


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[ModelStateClient]:
    client = ModelStateClient("http://modelstate", transport=httpx.ASGITransport(app=app))
    yield client
    await client.aclose()


def publish_meta(job_id: str = "job-1", **fields: Any) -> PublishRequest:
    return PublishRequest(job_id=job_id, kind=VersionKind.full, base_model="loom/tiny", **fields)


async def raw_publish(http: httpx.AsyncClient, meta: Any, files: list[tuple[str, bytes]]
                      ) -> httpx.Response:
    body = meta if isinstance(meta, str) else json.dumps(meta)
    parts = [("files", (name, data, "application/octet-stream")) for name, data in files]
    return await http.post("/v1/versions", data={"meta": body}, files=parts)


def assert_error(response: httpx.Response, status: int, text: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert text in error["message"], error


async def test_publish_a_model_directory_and_read_it_back(
    client: ModelStateClient, app: FastAPI, tiny_model_dir: Path, tmp_path: Path
) -> None:
    version = await client.publish(publish_meta(step=3, metrics={"reward": 0.5}), tiny_model_dir)
    expected = sorted(p.relative_to(tiny_model_dir).as_posix()
                      for p in tiny_model_dir.rglob("*") if p.is_file())
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
        str(version.local_path))
    copy = await client.download(version, tmp_path / "copy")
    assert (copy / "model.safetensors").read_bytes() == source
    remote_view = version.model_copy(update={"local_path": "/elsewhere/on/another/host"})
    cached = await local_or_download(remote_view, tmp_path / "cache", client=client)
    assert cached == tmp_path / "cache" / "job-1" / "1"
    assert (cached / "config.json").read_bytes() == (tiny_model_dir / "config.json").read_bytes()

    from transformers import AutoConfig  # the published directory is a normal HF model dir

    assert AutoConfig.from_pretrained(str(version.local_path)).hidden_size == 128


async def test_aliases_over_http(client: ModelStateClient, http: httpx.AsyncClient,
                                 tmp_path: Path) -> None:
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_model.safetensors").write_bytes(b"a1")
    await client.publish(publish_meta(), tmp_path / "adapter")
    (tmp_path / "adapter" / "adapter_model.safetensors").write_bytes(b"a2")
    await client.publish(publish_meta(aliases=["candidate"]), tmp_path / "adapter")

    response = await http.put("/v1/jobs/job-1/aliases/best", json={"number": 1})
    assert response.status_code == 200 and response.json() == {
        "job_id": "job-1", "name": "best", "number": 1}
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
    versions = await asyncio.gather(*(client.publish(publish_meta(step=i), d)
                                      for i, d in enumerate(directories)))
    assert sorted(v.number for v in versions) == [1, 2, 3, 4, 5]


async def assert_nothing_published(http: httpx.AsyncClient, app: FastAPI) -> None:
    assert (await http.get("/v1/jobs/job-1/versions")).json() == {"versions": []}
    versions_dir = app.state.store.blobs.versions
    assert list(versions_dir.iterdir()) == []


@pytest.mark.parametrize(
    ("meta", "files", "status", "text"),
    [
        ("{not json", [("w", b"x")], 422, "Invalid `meta` part"),
        ({"job_id": "job-1", "kind": "full", "base_model": "m", "colour": "red"},
         [("w", b"x")], 422, "colour: Extra inputs are not permitted"),
        ({"job_id": "job-1", "kind": "sideways", "base_model": "m"}, [("w", b"x")], 422, "kind"),
        ({"job_id": "../job", "kind": "full", "base_model": "m"}, [("w", b"x")], 422, "job_id"),
        ({"job_id": "job-1", "kind": "full", "base_model": "m", "sha256": {"w": "ab" * 32}},
         [("w", b"x")], 422, "declared sha256"),
        ({"job_id": "job-1", "kind": "full", "base_model": "m"},
         [("../../etc/passwd", b"x")], 422, "Unsafe file path"),
        ({"job_id": "job-1", "kind": "full", "base_model": "m"},
         [("/abs", b"x")], 422, "Unsafe file path"),
        ({"job_id": "job-1", "kind": "full", "base_model": "m"},
         [("w", b"x"), ("w", b"y")], 422, "appears twice"),
        ({"job_id": "job-1", "kind": "full", "base_model": "m", "parent": 3},
         [("w", b"x")], 404, "no version 3"),
    ],
)
async def test_bad_publish_is_a_clear_4xx_and_publishes_nothing(
    http: httpx.AsyncClient, app: FastAPI, meta: Any, files: list[tuple[str, bytes]],
    status: int, text: str,
) -> None:
    assert_error(await raw_publish(http, meta, files), status, text)
    await assert_nothing_published(http, app)


async def test_publish_without_parts_is_422(http: httpx.AsyncClient, app: FastAPI) -> None:
    no_files = await http.post("/v1/versions", data={"meta": "{}"})
    assert_error(no_files, 422, "files")
    no_meta = await http.post("/v1/versions", files=[("files", ("w", b"x"))])
    assert_error(no_meta, 422, "meta")
    await assert_nothing_published(http, app)


async def test_unknown_things_are_404(http: httpx.AsyncClient, client: ModelStateClient,
                                      tmp_path: Path) -> None:
    assert_error(await http.get("/v1/jobs/ghost/versions/1"), 404, "no published versions")
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "w").write_bytes(b"x")
    await client.publish(publish_meta(), tmp_path / "one")
    assert_error(await http.get("/v1/jobs/job-1/versions/7"), 404, "numbered 1..1")
    assert_error(await http.get("/v1/jobs/job-1/versions/best"), 404, "no alias 'best'")
    assert_error(await http.get("/v1/jobs/job-1/versions/1/files/nope"), 404, "no file 'nope'")
    assert_error(await http.put("/v1/jobs/job-1/aliases/best", json={"number": 2}), 404,
                 "no version 2")
    with pytest.raises(NotFound, match="no alias"):
        await client.get_version("job-1", "best")


async def test_malformed_alias_and_event_requests_are_422(http: httpx.AsyncClient) -> None:
    assert_error(await http.put("/v1/jobs/job-1/aliases/best", json={"number": 0}), 422, "number")
    assert_error(await http.put("/v1/jobs/job-1/aliases/best", json={"num": 1}), 422, "number")
    assert_error(await http.put("/v1/jobs/job-1/aliases/9lives", json={"number": 1}), 422, "name")
    assert_error(await http.get("/v1/events", params={"after": -1}), 422, "after")
    assert_error(await http.get("/v1/events", params={"job_id": "a/../b"}), 422, "job_id")
    assert_error(await http.get("/v1/events", headers={"Last-Event-ID": "x"}), 422,
                 "last-event-id")


async def test_client_rejects_bad_input_before_sending(client: ModelStateClient,
                                                       tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidInput, match="no files"):
        await client.publish(publish_meta(), tmp_path / "empty")


async def test_readiness_checks_the_database(http: httpx.AsyncClient) -> None:
    response = await http.get("/readyz")
    assert response.status_code == 200 and response.json()["detail"] == {"database": "ok"}


async def test_file_over_the_size_limit_is_413(tmp_path: Path) -> None:
    settings = ModelStateSettings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/m.db",
                                  modelstate_max_file_bytes=4)
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=transport, base_url="http://modelstate"
    ) as http:
        meta = {"job_id": "job-1", "kind": "full", "base_model": "m"}
        assert_error(await raw_publish(http, meta, [("w", b"12345")]), 413, "larger than")
        await assert_nothing_published(http, app)


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
