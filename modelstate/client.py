"""Async client of the model-state store, for the trainer, the rollout engines and the SDK.

Uploads and downloads stream (files are never held whole in memory) and are checked by sha256
end to end; `subscribe` follows the server's event stream across restarts of either side.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import httpx

from modelstate.blobstore import CHUNK_BYTES, check_relative_path
from modelstate.schemas import ManifestFile, PublishRequest, Version, VersionList
from services.common.errors import InvalidInput, UpstreamError
from services.common.http import ServiceClient, raise_for_envelope
from services.common.settings import LoomSettings

RECONNECT_MIN_S = 0.2
RECONNECT_MAX_S = 10.0
DOWNLOAD_ATTEMPTS = 3


class ModelStateClient:
    def __init__(
        self,
        base_url: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        event_read_timeout_s: float = 60.0,
    ) -> None:
        self._service = ServiceClient(base_url, service="modelstate", transport=transport)
        # Longer than the server's heartbeat period: silence this long means a dead connection.
        self._event_timeout = httpx.Timeout(connect=5.0, read=event_read_timeout_s,
                                            write=30.0, pool=30.0)

    async def publish(self, meta: PublishRequest, directory: Path) -> Version:
        """Upload every file under `directory` (relative paths as names) as a new version."""
        paths = sorted(p for p in Path(directory).rglob("*") if p.is_file())
        if not paths:
            raise InvalidInput(f"{directory} holds no files to publish.")
        names = [p.relative_to(directory).as_posix() for p in paths]
        for name in names:
            check_relative_path(name)
            if any(c in name for c in '"\r\n'):
                raise InvalidInput(f"File name {name!r} cannot be sent in a multipart header.")
        boundary = f"loom-{uuid.uuid4().hex}"
        body = _multipart_body(boundary, list(zip(names, paths, strict=True)), meta)
        response = await self._service.request(
            "POST", "/v1/versions", content=body,
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        )
        return Version.model_validate(response.json())

    async def get_version(self, job_id: str, ref: int | str) -> Version:
        return Version.model_validate(await self._service.get_json(_version_url(job_id, ref)))

    async def list_versions(self, job_id: str) -> list[Version]:
        body = await self._service.get_json(f"/v1/jobs/{quote(job_id, safe='')}/versions")
        return VersionList.model_validate(body).versions

    async def download(self, version: Version, dest: Path) -> Path:
        """Fetch every file of `version` into `dest`, each checked against its sha256 and
        renamed into place only when complete."""
        dest = Path(dest)
        for entry in version.files:
            target = dest / check_relative_path(entry.path)
            url = f"{_version_url(version.job_id, version.number)}/files/{quote(entry.path)}"
            await self._fetch_file(url, target, entry)
        return dest

    async def subscribe(self, job_id: str | None = None, after: int = 0) -> AsyncIterator[Version]:
        """Versions published after version id `after`, replayed then live, forever; a lost
        connection is retried with backoff and resumed from the last id seen."""
        cursor = after
        delay = RECONNECT_MIN_S
        while True:
            params: dict[str, str | int] = {"after": cursor}
            if job_id is not None:
                params["job_id"] = job_id
            try:
                async with self._service.http.stream(
                    "GET", "/v1/events", params=params, timeout=self._event_timeout,
                    headers={"Accept": "text/event-stream"},
                ) as response:
                    if response.status_code < 500:
                        await _raise_for_status(response)
                        async for event in _sse_events(response):
                            if event.name != "version":
                                continue
                            version = Version.model_validate_json(event.data)
                            cursor = max(cursor, version.id)
                            delay = RECONNECT_MIN_S
                            yield version
            except httpx.TransportError:
                pass  # server gone or silent for too long: reconnect below
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX_S)

    async def aclose(self) -> None:
        await self._service.aclose()

    async def _fetch_file(self, url: str, target: Path, entry: ManifestFile) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f".{target.name}.part-{uuid.uuid4().hex}")
        for attempt in range(DOWNLOAD_ATTEMPTS):
            try:
                digest = hashlib.sha256()
                async with self._service.http.stream("GET", url) as response:
                    await _raise_for_status(response)
                    with open(temp, "wb") as out:
                        async for chunk in response.aiter_bytes(CHUNK_BYTES):
                            digest.update(chunk)
                            out.write(chunk)
                break
            except httpx.TransportError as exc:
                temp.unlink(missing_ok=True)
                if attempt + 1 == DOWNLOAD_ATTEMPTS:
                    raise UpstreamError(f"modelstate: downloading {entry.path!r}: {exc!r}") from exc
                await asyncio.sleep(RECONNECT_MIN_S * 2**attempt)
        size = temp.stat().st_size
        if digest.hexdigest() != entry.sha256 or size != entry.size:
            temp.unlink()
            raise UpstreamError(
                f"modelstate: {entry.path!r} arrived corrupted ({size} bytes, sha256 "
                f"{digest.hexdigest()}; manifest: {entry.size} bytes, {entry.sha256})."
            )
        os.replace(temp, target)


async def local_or_download(
    version: Version, cache_dir: Path, *, client: ModelStateClient | None = None
) -> Path:
    """A directory holding `version`'s files: the store's own one when it is on this host
    (read in place, no copy), else a download into `cache_dir/<job>/<number>` (reused when
    already complete). Without `client`, one is made from `LOOM_MODELSTATE_URL`."""
    if version.local_path and matches_manifest(Path(version.local_path), version):
        return Path(version.local_path)
    dest = Path(cache_dir) / version.job_id / str(version.number)
    if matches_manifest(dest, version):
        return dest
    own_client = client is None
    client = client or ModelStateClient(LoomSettings().url_of("modelstate"))
    try:
        return await client.download(version, dest)
    finally:
        if own_client:
            await client.aclose()


def matches_manifest(directory: Path, version: Version) -> bool:
    """Every manifest file is present with its size (a cheap check; downloads verify hashes)."""
    try:
        return directory.is_dir() and all(
            (directory / entry.path).stat().st_size == entry.size for entry in version.files
        )
    except OSError:
        return False


def _version_url(job_id: str, ref: int | str) -> str:
    return f"/v1/jobs/{quote(job_id, safe='')}/versions/{quote(str(ref), safe='')}"


async def _raise_for_status(response: httpx.Response) -> None:
    if response.status_code >= 400:
        await response.aread()
        raise_for_envelope(response, "modelstate")


async def _multipart_body(
    boundary: str, files: list[tuple[str, Path]], meta: PublishRequest
) -> AsyncIterator[bytes]:
    """The files first, hashed as they stream; then `meta` carrying those hashes (the server
    reads the whole form before it looks at any part, so the order is free)."""
    hashes: dict[str, str] = {}
    for name, path in files:
        yield (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; "
               f"filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n").encode()
        digest = hashlib.sha256()
        with open(path, "rb") as source:
            while chunk := await asyncio.to_thread(source.read, CHUNK_BYTES):
                digest.update(chunk)
                yield chunk
        hashes[name] = digest.hexdigest()
        yield b"\r\n"
    meta_json = meta.model_copy(update={"sha256": hashes}).model_dump_json()
    yield (f"--{boundary}\r\nContent-Disposition: form-data; name=\"meta\"\r\n"
           f"Content-Type: application/json\r\n\r\n{meta_json}\r\n--{boundary}--\r\n").encode()


@dataclass
class _Event:
    name: str = "message"
    data_lines: list[str] = field(default_factory=list)

    @property
    def data(self) -> str:
        return "\n".join(self.data_lines)


async def _sse_events(response: httpx.Response) -> AsyncIterator[_Event]:
    """Server-sent events (the subset Loom sends: event, data, id, comments)."""
    event = _Event()
    async for line in response.aiter_lines():
        if not line:
            if event.data_lines:
                yield event
            event = _Event()
        elif line.startswith(":"):
            continue
        else:
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if key == "event":
                event.name = value
            elif key == "data":
                event.data_lines.append(value)
