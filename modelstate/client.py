"""Async client of the model-state store, for the trainer, the rollout engines and the SDK.

Publishing sends each distinct content once: files already in the store are not uploaded
again, and a writer on the store's own filesystem stages its files there (`staging_dir`) so
that publishing moves no bytes at all. Downloads verify sha256 and resume. `subscribe` follows
the store's event stream across restarts of either side.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2

from modelstate.blobstore import check_relative_path, hash_file
from modelstate.schemas import (
    FileRef,
    GcReport,
    ManifestFile,
    PendingVersion,
    PinList,
    PublishRequest,
    Retention,
    RetentionPolicy,
    StoreInfo,
    Version,
    VersionKey,
    VersionList,
    VersionMeta,
)
from modelstate.transfer import download_archive, download_file, raise_for_status, upload_blob
from services.common.errors import Conflict, InvalidInput, NotFound
from services.common.http import ServiceClient
from services.common.paths import segment
from services.common.service_token import service_headers
from services.common.settings import LoomSettings

RECONNECT_MIN_S = 0.2
RECONNECT_MAX_S = 10.0


class ModelStateClient:
    def __init__(
        self,
        base_url: str,
        *,
        transport: httpx2.AsyncBaseTransport | None = None,
        event_read_timeout_s: float = 60.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        """`headers`: sent with every request (a service's own client passes the service
        token's; see `from_settings`)."""
        self._service = ServiceClient(base_url, service="modelstate", transport=transport,
                                      headers=headers)
        # Longer than the server's heartbeat period: silence this long means a dead connection.
        self._event_timeout = httpx2.Timeout(connect=5.0, read=event_read_timeout_s,
                                             write=30.0, pool=30.0)
        self._info: StoreInfo | None = None

    @classmethod
    def from_settings(cls, settings: LoomSettings, **options: Any) -> ModelStateClient:
        """The store at `settings.modelstate_url`, called with the service token."""
        return cls(settings.url_of("modelstate"), headers=service_headers(settings), **options)

    # --- publishing --------------------------------------------------------------------------

    async def store_info(self) -> StoreInfo:
        if self._info is None:
            self._info = StoreInfo.model_validate(await self._service.get_json("/v1/store"))
        return self._info

    async def staging_dir(self) -> Path | None:
        """A fresh directory on the store's filesystem to write a version into, or None when
        this process cannot see that filesystem (then `publish` uploads)."""
        info = await self.store_info()
        try:
            shared = Path(info.marker_file).read_text().strip() == info.instance_id
        except OSError:
            shared = False
        if not shared:
            return None
        directory = Path(info.staging_dir) / uuid.uuid4().hex
        directory.mkdir()
        return directory

    async def publish(
        self, meta: VersionMeta, directory: Path, *, hashes: dict[str, str] | None = None
    ) -> Version:
        """Publish every file under `directory` (relative paths as names). `hashes`: sha256
        of files the caller already knows (e.g. computed while writing them). A directory
        from `staging_dir` is handed over in place and is gone afterwards."""
        directory = Path(directory)
        hashes = hashes or {}
        info = await self.store_info()
        if directory.parent == Path(info.staging_dir):
            declared = [FileRef(path=name, sha256=sha, size=(directory / name).stat().st_size)
                        for name, sha in sorted(hashes.items())]
            request = PublishRequest(**meta.model_dump(), staged=directory.name, files=declared)
            return await self._commit(request)
        files = _files_of(directory)
        refs = []
        for name, path in files:
            sha256 = hashes.get(name)
            if sha256 is None:
                sha256, size = await asyncio.to_thread(hash_file, path)
            else:
                size = path.stat().st_size
            refs.append(FileRef(path=name, sha256=sha256, size=size))
        request = PublishRequest(**meta.model_dump(), files=refs)
        paths = dict(files)
        await self._upload_missing(refs, paths)
        try:
            return await self._commit(request)
        except Conflict as exc:
            if not (isinstance(exc.detail, dict) and "missing" in exc.detail):
                raise
            # Collected between upload and commit (a very old blob): send them again, once.
            await self._upload_missing(refs, paths)
            return await self._commit(request)

    async def _upload_missing(self, refs: list[FileRef], paths: dict[str, Path]) -> None:
        for ref in {r.sha256: r for r in refs}.values():
            if not await self.has_blob(ref.sha256):
                await upload_blob(self._service.http, paths[ref.path], ref.sha256, ref.size)

    async def has_blob(self, sha256: str) -> bool:
        try:
            await self._service.get_json(f"/v1/blobs/{sha256}")
        except NotFound:
            return False
        return True

    async def _commit(self, request: PublishRequest) -> Version:
        response = await self._service.request(
            "POST", "/v1/versions", json=request.model_dump(mode="json"))
        return Version.model_validate(response.json())

    # --- reads -------------------------------------------------------------------------------

    async def get_version(self, job_id: str, ref: int | str) -> Version:
        return Version.model_validate(await self._service.get_json(_version_url(job_id, ref)))

    async def list_versions(self, job_id: str) -> list[Version]:
        body = await self._service.get_json(f"/v1/jobs/{segment(job_id)}/versions")
        return VersionList.model_validate(body).versions

    async def download(self, version: Version, dest: Path) -> Path:
        """Fetch every file of `version` into `dest`, each checked against its sha256 and
        renamed into place only when complete; a repeated call resumes."""
        dest = Path(dest)
        for entry in version.files:
            target = dest / check_relative_path(entry.path)
            if not (target.exists() and target.stat().st_size == entry.size):
                await self.download_entry(version, entry, target)
        return dest

    async def download_entry(self, version: Version, entry: ManifestFile, target: Path) -> None:
        """One file of `version` into `target`, checked against its sha256; resumed from a
        `.part` an earlier try (from here or from a peer with the same content) left."""
        url = f"{_version_url(version.job_id, version.number)}/files/{quote(entry.path)}"
        await download_file(self._service.http, url, target, entry)

    async def download_archive(self, version: Version, target: Path, *,
                               merge_lora: bool = False) -> Path:
        """The version as one tar file `target` (with `merge_lora`, a LoRA version merged into
        its base model: a full Hugging Face directory)."""
        url = f"{_version_url(version.job_id, version.number)}/archive"
        await download_archive(self._service.http, url, target, {"merge_lora": merge_lora})
        return target

    # --- housekeeping ------------------------------------------------------------------------

    async def set_retention(self, job_id: str, policy: RetentionPolicy) -> Retention:
        response = await self._service.request(
            "PUT", f"/v1/jobs/{segment(job_id)}/retention", json=policy.model_dump())
        return Retention.model_validate(response.json())

    async def collect_garbage(self) -> GcReport:
        """Apply every job's retention, delete unreferenced blobs, sweep crash leftovers."""
        return GcReport.model_validate(await self._service.post_json("/v1/gc"))

    # --- pins --------------------------------------------------------------------------------

    async def set_pins(self, holder: str, versions: list[VersionKey], ttl_s: float) -> PinList:
        response = await self._service.request(
            "PUT", f"/v1/pins/{segment(holder)}",
            json={"versions": [v.model_dump() for v in versions], "ttl_s": ttl_s})
        return PinList.model_validate(response.json())

    # --- events ------------------------------------------------------------------------------

    async def subscribe(self, job_id: str | None = None, after: int = 0) -> AsyncIterator[Version]:
        """Versions published after version id `after`, replayed then live, forever; a lost
        connection is retried with backoff and resumed from the last id seen."""
        async for event in self.subscribe_events(job_id, after):
            if isinstance(event, Version):
                yield event

    async def subscribe_events(
        self, job_id: str | None = None, after: int = 0
    ) -> AsyncIterator[Version | PendingVersion]:
        """`subscribe`, with the pending publishes announced while connected."""
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
                        await raise_for_status(response)
                        async for event in _sse_events(response):
                            if event.name == "pending":
                                yield PendingVersion.model_validate_json(event.data)
                            elif event.name == "version":
                                version = Version.model_validate_json(event.data)
                                cursor = max(cursor, version.id)
                                delay = RECONNECT_MIN_S
                                yield version
            except httpx2.TransportError:
                pass  # server gone or silent for too long: reconnect below
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX_S)

    async def aclose(self) -> None:
        await self._service.aclose()


async def local_or_download(
    version: Version, cache_dir: Path, *, client: ModelStateClient | None = None,
    in_place: bool = True, fetch: Callable[[Version, Path], Awaitable[Path]] | None = None,
) -> Path:
    """A directory holding `version`'s files: the store's own one when it is on this host
    and `in_place` (read there, no copy), else a download into `cache_dir/<job>/<number>`
    (reused when already complete, resumed when a previous download was cut off) by `fetch`,
    or from the store. Without `client`, one is made from the `LOOM_*` settings."""
    if in_place and version.local_path and matches_manifest(Path(version.local_path), version):
        return Path(version.local_path)
    dest = Path(cache_dir) / version.job_id / str(version.number)
    if matches_manifest(dest, version):
        return dest
    if fetch is not None:
        return await fetch(version, dest)
    own_client = client is None
    client = client or ModelStateClient.from_settings(LoomSettings())
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


def _files_of(directory: Path) -> list[tuple[str, Path]]:
    paths = sorted(p for p in directory.rglob("*") if p.is_file())
    if not paths:
        raise InvalidInput(f"{directory} holds no files to publish.")
    files = [(p.relative_to(directory).as_posix(), p) for p in paths]
    for name, _ in files:
        check_relative_path(name)
    return files


def _version_url(job_id: str, ref: int | str) -> str:
    return f"/v1/jobs/{segment(job_id)}/versions/{segment(ref)}"


@dataclass
class _Event:
    name: str = "message"
    data_lines: list[str] = field(default_factory=list)

    @property
    def data(self) -> str:
        return "\n".join(self.data_lines)


async def _sse_events(response: httpx2.Response) -> AsyncIterator[_Event]:
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
