"""A version's files fetched from a replica that already holds them, before the store: N
replicas on N hosts do not cost the store N times a version's bytes (each replica fetches from
one that got it earlier: a chain or a tree, as publishes reach them).

Which replicas hold a version is the gateway's routing table (`GET /v1/internal/replicas`:
the versions each replica's heartbeat reports resident). Files move by content: a replica
serves any file of the versions it materialized by its sha256 (`GET /v1/blobs/{sha256}`,
service token) with HTTP ranges, and the fetch is the store's own protocol
(`modelstate.transfer.download_file`): checked against the manifest's sha256 before it is
renamed into place, resumed from the `.part` a broken transfer left, whichever source sent
the first bytes (same hash, same bytes). A peer that fails, is gone or sends other bytes
is passed over; the store is the last source.
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
from services.rollout.client import BLOB
from services.rollout.gateway_calls import GatewayReplicas

log = logging.getLogger(__name__)
SHA256_PATTERN = r"^[0-9a-f]{64}$"


class Peers(Protocol):
    async def holding(self, job_id: str, number: int) -> list[str]:
        """URLs of other replicas that hold version `number` of `job_id`, best first."""
        ...


class GatewayPeers:
    """Peers from the gateway's table: ready replicas reachable at their last heartbeat that
    report the version resident, least loaded first; this replica left out."""

    def __init__(self, gateway: GatewayReplicas, own_url: str) -> None:
        self.gateway = gateway
        self.own_url = own_url.rstrip("/")

    async def holding(self, job_id: str, number: int) -> list[str]:
        try:
            table = await self.gateway.table()
        except (LoomError, ValueError, ValidationError) as exc:
            log.info("no peer list from the gateway (%s): fetching from the store", exc)
            return []
        held = [
            replica
            for replica in table.replicas
            if not replica.static
            and replica.ready
            and not replica.set_aside
            and replica.url.rstrip("/") != self.own_url
            and any((v.job_id, v.number) == (job_id, number) for v in replica.versions)
        ]
        return [replica.url for replica in sorted(held, key=lambda r: r.requests_in_flight)]


@dataclass
class HeldFiles:
    """The files of the versions this replica materialized, by content: what it serves its
    peers."""

    paths: dict[str, Path] = field(default_factory=dict)

    def add(self, version: Version, directory: Path) -> None:
        for entry in version.files:
            self.paths[entry.sha256] = directory / check_relative_path(entry.path)

    def path(self, sha256: str) -> Path | None:
        """The file with content `sha256`, while it is there."""
        path = self.paths.get(sha256)
        return path if path is not None and path.is_file() else None


@dataclass
class FetchCounts:
    from_peers: int = 0
    from_store: int = 0


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
        peers = await self.peers.holding(version.job_id, version.number) if missing else []
        for entry, target in missing:
            await self._fetch_file(version, entry, target, peers)
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
            return
        await self.store.download_entry(version, entry, target)
        self.counts.from_store += 1


def _complete(target: Path, entry: ManifestFile) -> bool:
    return target.is_file() and target.stat().st_size == entry.size
