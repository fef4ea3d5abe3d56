"""A version's files fetched from other replicas before the store: N replicas on N hosts do
not cost the store N times a version's bytes.

A replica about to fetch a version claims it at the gateway (`POST
/v1/internal/replicas/{id}/fetches`), which answers where to fetch from: the replica that
claimed it just before, then earlier ones, then replicas holding it. Replicas a publish reaches
at the same moment thus form a chain: the first fetches from the store, each next one from the
one before, which serves each file while it still arrives (`services.rollout.arriving`), so
every replica uploads the files once and the chain ends about when its first link does.

Files move by content: a replica serves the files it holds or is fetching by sha256 (`GET
/v1/blobs/{sha256}`, service token) with HTTP ranges, and the fetch is the store's own protocol
(`modelstate.transfer.download_file`): checked against the manifest's sha256 before it is
renamed into place, resumed from the `.part` a broken transfer left, whichever source sent
the first bytes (same hash, same bytes). A peer that fails, is gone or sends other bytes is
passed over for the next one (its downstream resumes from the one before it); the store is the
last source.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx2
from pydantic import ValidationError

from modelstate.blobstore import check_relative_path
from modelstate.client import ModelStateClient, local_or_download
from modelstate.schemas import ManifestFile, Version
from modelstate.transfer import download_file
from services.common.errors import LoomError
from services.rollout.arriving import Arriving
from services.rollout.client import BLOB
from services.rollout.gateway_calls import GatewayReplicas

log = logging.getLogger(__name__)
SHA256_PATTERN = r"^[0-9a-f]{64}$"


class Peers(Protocol):
    async def sources(self, job_id: str, number: int) -> list[str]:
        """URLs of other replicas to fetch version `number` of `job_id` from, best first;
        called once this replica serves the files it is about to fetch."""
        ...


class GatewayPeers:
    """Sources from the gateway's claims (`gateway.proxy.replicas.ReplicaRegistry.claim`)."""

    def __init__(self, gateway: GatewayReplicas, replica_id: str) -> None:
        self.gateway = gateway
        self.replica_id = replica_id

    async def sources(self, job_id: str, number: int) -> list[str]:
        try:
            return (await self.gateway.claim(self.replica_id, job_id, number)).sources
        except (LoomError, ValueError, ValidationError) as exc:
            log.info("no peer list from the gateway (%s): fetching from the store", exc)
            return []


@dataclass
class HeldFiles:
    """What this replica serves its peers, by content: the files of the versions it
    materialized, and those it is fetching (as they arrive)."""

    paths: dict[str, Path] = field(default_factory=dict)
    arriving: dict[str, Arriving] = field(default_factory=dict)

    def add(self, version: Version, directory: Path) -> None:
        for entry in version.files:
            self.paths[entry.sha256] = directory / check_relative_path(entry.path)

    def path(self, sha256: str) -> Path | None:
        """The file with content `sha256`, while it is there."""
        path = self.paths.get(sha256)
        return path if path is not None and path.is_file() else None


@dataclass
class FetchCounts:
    """Files fetched, and their sizes in bytes, by source."""

    from_peers: int = 0
    from_store: int = 0
    bytes_from_peers: int = 0
    bytes_from_store: int = 0


class Fetcher:
    """`materialize` for `Versions`: the store's directory read in place when it is on this
    host (and `in_place`), else every missing file from a peer, or the store."""

    def __init__(
        self,
        store: ModelStateClient,
        peers: Peers,
        http: httpx2.AsyncClient,
        cache_dir: Path,
        *,
        in_place: bool = True,
    ) -> None:
        self.store = store
        self.peers = peers
        self.http = http  # sends the service token peers ask for
        self.cache_dir = cache_dir
        self.in_place = in_place
        self.held = HeldFiles()
        self.counts = FetchCounts()
        self._fetching: dict[tuple[str, int], asyncio.Future[Path]] = {}

    async def materialize(self, version: Version) -> Path:
        """One fetch per version at a time: a request and the publish follower asking for the
        same version at once share it (two writers of one `.part` file would corrupt it or
        race to rename it). A caller cancelled while waiting leaves the fetch running."""
        key = (version.job_id, version.number)
        fetching = self._fetching.get(key)
        if fetching is None:
            fetching = self._fetching[key] = asyncio.ensure_future(self._materialize(version))
            fetching.add_done_callback(lambda _: self._fetching.pop(key, None))
        return await asyncio.shield(fetching)

    async def _materialize(self, version: Version) -> Path:
        directory = await local_or_download(
            version, self.cache_dir, in_place=self.in_place, fetch=self.fetch
        )
        self.held.add(version, directory)
        return directory

    async def fetch(self, version: Version, dest: Path) -> Path:
        missing = [
            (entry, target)
            for entry in version.files
            if not _complete(target := dest / check_relative_path(entry.path), entry)
        ]
        if not missing:
            return dest
        # Served from the moment the claim is made: a replica the gateway points at this one
        # asks for the files right away.
        arriving = [Arriving(target, entry.size) for entry, target in missing]
        for (entry, _), file in zip(missing, arriving, strict=True):
            self.held.arriving[entry.sha256] = file
        try:
            peers = await self.peers.sources(version.job_id, version.number)
            for entry, target in missing:
                await self._fetch_file(version, entry, target, peers)
                self.held.paths[entry.sha256] = target  # verified: served as a whole file
        finally:
            for (entry, _), file in zip(missing, arriving, strict=True):
                file.fetching = False
                if self.held.arriving.get(entry.sha256) is file:
                    del self.held.arriving[entry.sha256]
        return dest

    async def _fetch_file(
        self, version: Version, entry: ManifestFile, target: Path, peers: list[str]
    ) -> None:
        for peer in list(peers):
            try:
                await download_file(
                    self.http, f"{peer}{BLOB.url(sha256=entry.sha256)}", target, entry
                )
            except LoomError as exc:
                log.warning(
                    "%s of %s v%d from the replica at %s failed (%s): trying the next source",
                    entry.path,
                    version.job_id,
                    version.number,
                    peer,
                    exc.message,
                )
                peers.remove(peer)  # not asked for the version's other files
                continue
            self.counts.from_peers += 1
            self.counts.bytes_from_peers += entry.size
            return
        await self.store.download_entry(version, entry, target)
        self.counts.from_store += 1
        self.counts.bytes_from_store += entry.size


def _complete(target: Path, entry: ManifestFile) -> bool:
    return target.is_file() and target.stat().st_size == entry.size
