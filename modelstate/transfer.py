"""Moving files between the store and a client: streamed uploads, downloads that verify
sha256 and resume an interrupted file where it stopped (HTTP Range), and whole-version tar
archives."""

from __future__ import annotations

import asyncio
import os
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2

from modelstate.blobstore import CHUNK_BYTES, hash_file
from modelstate.schemas import ManifestFile
from services.common.errors import UpstreamError
from services.common.http import raise_for_envelope, retrying

ATTEMPTS = 4


async def file_chunks(path: Path) -> AsyncIterator[bytes]:
    with open(path, "rb") as source:
        while chunk := await asyncio.to_thread(source.read, CHUNK_BYTES):
            yield chunk


async def raise_for_status(response: httpx2.Response) -> None:
    if response.status_code >= 400:
        await response.aread()
        raise_for_envelope(response, "modelstate")


async def upload_blob(http: httpx2.AsyncClient, url: str, path: Path, size: int) -> None:
    """PUT one file's content to its blob `url` (idempotent: retried from the start after a
    broken transfer)."""
    response = await retrying(
        lambda: http.put(
            url,
            content=file_chunks(path),
            headers={"Content-Length": str(size), "Content-Type": "application/octet-stream"},
        ),
        ATTEMPTS,
        lambda exc: UpstreamError(f"modelstate: uploading {path.name}: {exc!r}"),
    )
    raise_for_envelope(response, "modelstate")


def part_path(target: Path) -> Path:
    """Where `download_file` gathers `target`'s bytes before they are checked (a peer replica
    serves a file from there while it arrives: `services.rollout.arriving`)."""
    return target.with_name(f".{target.name}.part")


async def download_file(
    http: httpx2.AsyncClient, url: str, target: Path, entry: ManifestFile
) -> None:
    """Fetch `entry` into `target`. Bytes land in `.<name>.part` first; a broken transfer, or
    a later call after a crash, continues from the part's end; the whole file is checked
    against the manifest before it is renamed into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    part = part_path(target)
    await retrying(
        lambda: _fetch_rest(http, url, part, entry.size),
        ATTEMPTS,
        lambda exc: UpstreamError(f"modelstate: downloading {entry.path!r}: {exc!r}"),
    )
    sha256, size = await asyncio.to_thread(hash_file, part)
    if sha256 != entry.sha256 or size != entry.size:
        part.unlink()
        raise UpstreamError(
            f"modelstate: {entry.path!r} arrived corrupted ({size} bytes, sha256 {sha256}; "
            f"manifest: {entry.size} bytes, {entry.sha256})."
        )
    os.replace(part, target)


async def _fetch_rest(http: httpx2.AsyncClient, url: str, part: Path, size: int) -> None:
    have = part.stat().st_size if part.exists() else 0
    if have > size:  # not a prefix of this file: start over
        part.unlink()
        have = 0
    if have == size:
        return
    headers = {"Range": f"bytes={have}-"} if have else {}
    async with http.stream("GET", url, headers=headers) as response:
        await raise_for_status(response)
        mode = "ab" if response.status_code == 206 else "wb"  # 200: the server sent it all
        with open(part, mode) as out:
            async for chunk in response.aiter_bytes(CHUNK_BYTES):
                out.write(chunk)


async def download_archive(
    http: httpx2.AsyncClient, url: str, target: Path, params: dict[str, str | bool]
) -> None:
    """Stream a version's tar archive into the file `target`."""
    try:
        async with http.stream("GET", url, params=params) as response:
            await raise_for_status(response)
            with open(target, "wb") as out:
                async for chunk in response.aiter_bytes(CHUNK_BYTES):
                    out.write(chunk)
    except httpx2.TransportError as exc:
        raise UpstreamError(f"modelstate: downloading {url}: {exc!r}") from exc


def unpack_archive(archive_path: Path, dest: Path) -> None:
    """Members land under `dest` without the archive's top directory; the `data` filter
    refuses absolute paths, links out of `dest` and special files."""
    with tarfile.open(archive_path, mode="r|") as archive:
        for member in archive:
            member.name = member.name.split("/", 1)[1]
            archive.extract(member, dest, filter="data")
