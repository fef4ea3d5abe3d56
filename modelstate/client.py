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

import httpx2

from modelstate.blobstore import check_relative_path, hash_file
from modelstate.schemas import (
    Alias,
    FileRef,
    GcReport,
    Lineage,
    ManifestDiff,
    ManifestFile,
    MoveAlias,
    PendingVersion,
    PinList,
    PinRequest,
    PublishRequest,
    Retention,
    RetentionPolicy,
    StoredBlob,
    StoreInfo,
    Version,
    VersionKey,
    VersionList,
    VersionMeta,
)
from modelstate.transfer import download_archive, download_file, raise_for_status, upload_blob
from services.common.errors import Conflict, InvalidInput, NotFound
from services.common.http import Route, ServiceClient
from services.common.service_token import client_of
from services.common.settings import LoomSettings

RECONNECT_MIN_S = 0.2
RECONNECT_MAX_S = 10.0

STORE_INFO = Route("GET", "/v1/store", StoreInfo)
GET_BLOB = Route("GET", "/v1/blobs/{sha256}", StoredBlob)
# The body is the file's raw bytes (`transfer.upload_blob` streams them).
PUT_BLOB = Route("PUT", "/v1/blobs/{sha256}", StoredBlob)
PUBLISH = Route("POST", "/v1/versions", Version, PublishRequest)
LIST_VERSIONS = Route("GET", "/v1/jobs/{job_id}/versions", VersionList)
GET_VERSION = Route("GET", "/v1/jobs/{job_id}/versions/{ref}", Version)
DELETE_VERSION = Route("DELETE", "/v1/jobs/{job_id}/versions/{number}", Version)
LINEAGE = Route("GET", "/v1/jobs/{job_id}/versions/{ref}/lineage", Lineage)
COMPARE = Route("GET", "/v1/jobs/{job_id}/compare", ManifestDiff)
# Streamed, not JSON: read by `transfer.download_file` and `transfer.download_archive`.
VERSION_FILE: Route[None] = Route(
    "GET", "/v1/jobs/{job_id}/versions/{ref}/files/{path}", None, whole_paths=frozenset({"path"})
)
ARCHIVE: Route[None] = Route("GET", "/v1/jobs/{job_id}/versions/{ref}/archive", None)
MOVE_ALIAS = Route("PUT", "/v1/jobs/{job_id}/aliases/{name}", Alias, MoveAlias)
DELETE_ALIAS: Route[None] = Route("DELETE", "/v1/jobs/{job_id}/aliases/{name}", None)
SET_PINS = Route("PUT", "/v1/pins/{holder}", PinList, PinRequest)
CLEAR_PINS: Route[None] = Route("DELETE", "/v1/pins/{holder}", None)
LIST_PINS = Route("GET", "/v1/pins", PinList)
GET_RETENTION = Route("GET", "/v1/jobs/{job_id}/retention", Retention)
SET_RETENTION = Route("PUT", "/v1/jobs/{job_id}/retention", Retention, RetentionPolicy)
GC = Route("POST", "/v1/gc", GcReport)
# Server-sent events, read by `subscribe_events`.
EVENTS: Route[None] = Route("GET", "/v1/events", None)


class ModelStateClient(ServiceClient):
    SERVICE = "modelstate"

    def __init__(
        self,
        base_url: str | httpx2.AsyncClient,
        *,
        event_read_timeout_s: float = 60.0,
        **options: Any,
    ) -> None:
        """`options`: `ServiceClient`'s (`headers`: sent with every request; a service's
        own client passes the service token's, see `from_settings`)."""
        super().__init__(base_url, **options)
        # Longer than the server's heartbeat period: silence this long means a dead connection.
        self._event_timeout = httpx2.Timeout(
            connect=5.0, read=event_read_timeout_s, write=30.0, pool=30.0
        )
        self._info: StoreInfo | None = None

    @classmethod
    def from_settings(cls, settings: LoomSettings, **options: Any) -> ModelStateClient:
        """The store at `settings.modelstate_url`, called with the service token."""
        return client_of(settings, cls, **options)

    # --- publishing --------------------------------------------------------------------------

    async def store_info(self) -> StoreInfo:
        if self._info is None:
            self._info = await self.call(STORE_INFO)
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
            declared = [
                FileRef(path=name, sha256=sha, size=(directory / name).stat().st_size)
                for name, sha in sorted(hashes.items())
            ]
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
                await upload_blob(
                    self.http, self.path(PUT_BLOB.url(sha256=ref.sha256)), paths[ref.path], ref.size
                )

    async def get_blob(self, sha256: str) -> StoredBlob:
        return await self.call(GET_BLOB, sha256=sha256)

    async def has_blob(self, sha256: str) -> bool:
        try:
            await self.get_blob(sha256)
        except NotFound:
            return False
        return True

    async def _commit(self, request: PublishRequest) -> Version:
        return await self.call(PUBLISH, request)

    # --- reads -------------------------------------------------------------------------------

    async def get_version(self, job_id: str, ref: int | str) -> Version:
        return await self.call(GET_VERSION, job_id=job_id, ref=ref)

    async def list_versions(self, job_id: str) -> list[Version]:
        return (await self.call(LIST_VERSIONS, job_id=job_id)).versions

    async def lineage(self, job_id: str, ref: int | str) -> Lineage:
        return await self.call(LINEAGE, job_id=job_id, ref=ref)

    async def compare(self, job_id: str, a: int | str, b: int | str) -> ManifestDiff:
        return await self.call(COMPARE, params={"a": a, "b": b}, job_id=job_id)

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
        url = VERSION_FILE.url(job_id=version.job_id, ref=version.number, path=entry.path)
        await download_file(self.http, self.path(url), target, entry)

    async def download_archive(
        self, version: Version, target: Path, *, merge_lora: bool = False
    ) -> Path:
        """The version as one tar file `target` (with `merge_lora`, a LoRA version merged into
        its base model: a full Hugging Face directory)."""
        url = self.path(ARCHIVE.url(job_id=version.job_id, ref=version.number))
        await download_archive(self.http, url, target, {"merge_lora": merge_lora})
        return target

    # --- versions and aliases ----------------------------------------------------------------

    async def delete_version(self, job_id: str, number: int) -> Version:
        """409 while an alias points at it or a serving engine pins it."""
        return await self.call(DELETE_VERSION, job_id=job_id, number=number)

    async def move_alias(self, job_id: str, name: str, number: int) -> Alias:
        return await self.call(MOVE_ALIAS, MoveAlias(number=number), job_id=job_id, name=name)

    async def delete_alias(self, job_id: str, name: str) -> None:
        await self.call(DELETE_ALIAS, job_id=job_id, name=name)

    # --- housekeeping ------------------------------------------------------------------------

    async def get_retention(self, job_id: str) -> Retention:
        return await self.call(GET_RETENTION, job_id=job_id)

    async def set_retention(self, job_id: str, policy: RetentionPolicy) -> Retention:
        return await self.call(SET_RETENTION, policy, job_id=job_id)

    async def collect_garbage(self, grace_s: float | None = None) -> GcReport:
        """Apply every job's retention, delete unreferenced blobs, sweep crash leftovers."""
        return await self.call(GC, params={} if grace_s is None else {"grace_s": grace_s})

    # --- pins --------------------------------------------------------------------------------

    async def set_pins(self, holder: str, versions: list[VersionKey], ttl_s: float) -> PinList:
        return await self.call(SET_PINS, PinRequest(versions=versions, ttl_s=ttl_s), holder=holder)

    async def clear_pins(self, holder: str) -> None:
        await self.call(CLEAR_PINS, holder=holder)

    async def list_pins(self) -> PinList:
        return await self.call(LIST_PINS)

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
                async with self.http.stream(
                    EVENTS.method,
                    self.path(EVENTS.path),
                    params=params,
                    timeout=self._event_timeout,
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


async def local_or_download(
    version: Version,
    cache_dir: Path,
    *,
    client: ModelStateClient | None = None,
    in_place: bool = True,
    fetch: Callable[[Version, Path], Awaitable[Path]] | None = None,
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
