"""Moving files to and from a store on another host. Uploads and downloads stream: a file
many times the memory bound crosses with neither side's memory growing by more than it.
Downloads resume where they stopped: after a dropped connection (within the call) and after
a crash (a later call finds the `.part` file), with HTTP Range requests to the real store
app; whatever arrives is checked against the manifest before it is used."""

from __future__ import annotations

import hashlib
import os
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest
from fastapi import FastAPI

from modelstate.app import create_app
from modelstate.client import ModelStateClient
from modelstate.schemas import Version, VersionKind, VersionMeta
from modelstate.settings import ModelStateSettings
from services.common.errors import UpstreamError
from services.common.service_token import service_headers
from services.common.settings import LoomSettings
from tests.support.modelstate_process import StoreProcess

WEIGHTS = os.urandom(3 * 2**20 + 123)
CUT_AT = 2**20 + 7  # where the first transfer breaks: not on a chunk boundary
MiB = 2**20
LARGE_FILE_MIB = 256
MEMORY_BOUND_MIB = 64  # the bound on a publisher's extra memory


class _CutStream(httpx2.AsyncByteStream):
    """A response body that stops with a ReadError after `limit` bytes."""

    def __init__(self, inner: httpx2.AsyncByteStream, limit: int) -> None:
        self.inner, self.limit = inner, limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        sent = 0
        async for chunk in self.inner:
            piece = chunk[: self.limit - sent]
            sent += len(piece)
            if piece:
                yield piece
            if sent >= self.limit:
                raise httpx2.ReadError("connection dropped")

    async def aclose(self) -> None:
        await self.inner.aclose()


class DroppingTransport(httpx2.AsyncBaseTransport):
    """The store app in-process; with `drop`, the first download of the weights file breaks
    after CUT_AT bytes. Records (Range header, status) of each request for the weights file."""

    def __init__(self, app: FastAPI, drop: bool) -> None:
        self.inner = httpx2.ASGITransport(app=app)
        self.drop = drop
        self.requests: list[tuple[str | None, int]] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        if not request.url.path.endswith("/files/model.safetensors"):
            return response
        self.requests.append((request.headers.get("Range"), response.status_code))
        if not self.drop:
            return response
        self.drop = False
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_CutStream(response.stream, CUT_AT),
            request=request,
        )


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    settings = ModelStateSettings(
        data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'm.db'}"
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        yield app


@pytest.fixture
async def version(app: FastAPI, tmp_path: Path) -> Version:
    source = tmp_path / "source"
    source.mkdir()
    (source / "model.safetensors").write_bytes(WEIGHTS)
    (source / "config.json").write_bytes(b"{}")
    client = ModelStateClient(
        "http://modelstate",
        transport=httpx2.ASGITransport(app=app),
        headers=service_headers(app.state.settings),
    )
    try:
        return await client.publish(
            VersionMeta(job_id="job-1", kind=VersionKind.full, base_model="loom/tiny"), source
        )
    finally:
        await client.aclose()


async def download(
    app: FastAPI, version: Version, dest: Path, drop: bool = False
) -> list[tuple[str | None, int]]:
    """Download `version` into `dest`; the requests for its weights file."""
    transport = DroppingTransport(app, drop)
    client = ModelStateClient(
        "http://modelstate", transport=transport, headers=service_headers(app.state.settings)
    )
    try:
        await client.download(version, dest)
    finally:
        await client.aclose()
    return transport.requests


async def test_a_dropped_connection_resumes_from_where_it_stopped(
    app: FastAPI, version: Version, tmp_path: Path
) -> None:
    dest = tmp_path / "dest"
    first, (resume_range, status) = await download(app, version, dest, drop=True)
    assert first == (None, 200) and status == 206 and resume_range is not None
    # From the end of what was written before the break (the client writes whole chunks).
    resumed_at = int(resume_range.removeprefix("bytes=").removesuffix("-"))
    assert 0 < resumed_at <= CUT_AT
    assert (dest / "model.safetensors").read_bytes() == WEIGHTS
    assert not list(dest.glob(".*.part"))


async def test_a_later_call_continues_a_part_file_left_by_a_crash(
    app: FastAPI, version: Version, tmp_path: Path
) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / ".model.safetensors.part").write_bytes(WEIGHTS[:CUT_AT])
    assert await download(app, version, dest) == [(f"bytes={CUT_AT}-", 206)]
    assert (dest / "model.safetensors").read_bytes() == WEIGHTS


async def test_a_part_file_that_is_not_a_prefix_is_refused_then_fetched_whole(
    app: FastAPI, version: Version, tmp_path: Path
) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    part = dest / ".model.safetensors.part"
    part.write_bytes(b"x" * CUT_AT)  # the right length, the wrong bytes
    with pytest.raises(UpstreamError, match="arrived corrupted"):
        await download(app, version, dest)
    assert not part.exists() and not (dest / "model.safetensors").exists()
    assert await download(app, version, dest) == [(None, 200)]
    assert (dest / "model.safetensors").read_bytes() == WEIGHTS

    part.write_bytes(WEIGHTS + b"more")  # longer than the file: started over
    (dest / "model.safetensors").unlink()
    assert await download(app, version, dest) == [(None, 200)]
    assert (dest / "model.safetensors").read_bytes() == WEIGHTS


def peak_rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])


async def test_a_large_file_crosses_in_both_directions_in_bounded_memory(tmp_path: Path) -> None:
    """The store as a real process: its peak RSS, and the Python allocations of this client,
    grow by less than MEMORY_BOUND_MIB while a file of LARGE_FILE_MIB goes up and comes back."""
    source = tmp_path / "source"
    source.mkdir()
    digest = hashlib.sha256()
    with open(source / "model.safetensors", "wb") as out:
        for _ in range(LARGE_FILE_MIB // 16):
            piece = os.urandom(16 * MiB)
            digest.update(piece)
            out.write(piece)
    store = StoreProcess(tmp_path / "data", f"sqlite:///{tmp_path / 'm.db'}")
    store.start()
    client = ModelStateClient.from_settings(LoomSettings(modelstate_url=store.url))
    try:
        store_before = peak_rss_kib(store.pid)
        tracemalloc.start()
        version = await client.publish(
            VersionMeta(job_id="job-1", kind=VersionKind.full, base_model="loom/tiny"), source
        )
        uploading_mib = tracemalloc.get_traced_memory()[1] / MiB
        tracemalloc.reset_peak()
        await client.download(version, tmp_path / "dest")
        downloading_mib = tracemalloc.get_traced_memory()[1] / MiB
        tracemalloc.stop()
        store_growth_mib = (peak_rss_kib(store.pid) - store_before) / 1024
    finally:
        await client.aclose()
        store.kill()
    assert version.files[0].sha256 == digest.hexdigest()
    assert (tmp_path / "dest" / "model.safetensors").stat().st_size == LARGE_FILE_MIB * MiB
    assert max(uploading_mib, downloading_mib, store_growth_mib) < MEMORY_BOUND_MIB, (
        uploading_mib,
        downloading_mib,
        store_growth_mib,
    )
