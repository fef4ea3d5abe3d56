"""A version's files from a peer replica before the store: peers first, checked by hash, a
broken or lying peer passed over for the next source, a cut transfer resumed where it stopped,
the store's directory read in place only when asked; and the gateway's claim that says where
to fetch from. Peers, store and gateway are fakes over HTTP (MockTransport)."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime
from pathlib import Path

import httpx2
import pytest

from modelstate.client import ModelStateClient
from modelstate.schemas import ManifestFile, Version, VersionKind
from modelstate.transfer import ATTEMPTS
from services.rollout.fanout import Fetcher, GatewayPeers
from services.rollout.gateway_calls import GatewayReplicas

WEIGHTS = bytes(range(256)) * 64  # 16 KiB
CONFIG = b'{"r": 8}'
STORE = "http://store"
PEER_A, PEER_B = "http://10.0.0.1:8001", "http://10.0.0.2:8001"


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def version(local_path: Path | None = None) -> Version:
    return Version(
        id=7,
        job_id="j1",
        number=3,
        parent=None,
        step=3,
        kind=VersionKind.lora,
        base_model="loom/tiny",
        metrics={},
        aliases=[],
        created_at=datetime.now(UTC),
        local_path=None if local_path is None else str(local_path),
        files=[
            ManifestFile(path="adapter_config.json", size=len(CONFIG), sha256=digest(CONFIG)),
            ManifestFile(
                path="adapter_model.safetensors", size=len(WEIGHTS), sha256=digest(WEIGHTS)
            ),
        ],
    )


class Sources:
    """The store and two peers: what each was asked, and how each peer misbehaves."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, str | None]] = []  # (host, path, Range)
        self.peer_blobs: dict[str, dict[str, bytes]] = {PEER_A: {}, PEER_B: {}}
        self.broken: set[str] = set()  # peers that refuse connections

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        origin = f"{request.url.scheme}://{request.url.netloc.decode()}"
        self.asked.append((origin, request.url.path, request.headers.get("range")))
        if origin == STORE:
            name = request.url.path.rsplit("/", 1)[1]
            data = {"adapter_config.json": CONFIG, "adapter_model.safetensors": WEIGHTS}[name]
        elif origin in self.broken:
            raise httpx2.ConnectError("refused", request=request)
        else:
            found = self.peer_blobs[origin].get(request.url.path.rsplit("/", 1)[1])
            if found is None:
                return httpx2.Response(
                    404, json={"error": {"code": "not_found", "message": "no such blob"}}
                )
            data = found
        wanted = request.headers.get("range")
        if wanted:
            start = int(wanted.removeprefix("bytes=").rstrip("-"))
            return httpx2.Response(206, content=data[start:])
        return httpx2.Response(200, content=data)

    def from_peers(self) -> list[tuple[str, str | None]]:
        return [(host, rng) for host, _, rng in self.asked if host != STORE]

    def from_store(self) -> list[str]:
        return [path.rsplit("/", 1)[1] for host, path, _ in self.asked if host == STORE]


class FixedPeers:
    def __init__(self, *urls: str) -> None:
        self.urls = list(urls)

    async def sources(self, job_id: str, number: int) -> list[str]:
        assert (job_id, number) == ("j1", 3)
        return list(self.urls)


@pytest.fixture
def sources() -> Sources:
    return Sources()


def fetcher(sources: Sources, tmp_path: Path, *peers: str, in_place: bool = False) -> Fetcher:
    transport = httpx2.MockTransport(sources.handle)
    store = ModelStateClient(STORE, transport=transport)
    return Fetcher(
        store,
        FixedPeers(*peers),
        httpx2.AsyncClient(transport=transport),
        tmp_path / "cache",
        in_place=in_place,
    )


async def test_a_peer_that_holds_the_files_serves_them_and_the_store_is_not_asked(
    sources: Sources, tmp_path: Path
) -> None:
    sources.peer_blobs[PEER_A] = {digest(CONFIG): CONFIG, digest(WEIGHTS): WEIGHTS}
    fetch = fetcher(sources, tmp_path, PEER_A)
    directory = await fetch.materialize(version())
    assert (directory / "adapter_model.safetensors").read_bytes() == WEIGHTS
    assert sources.from_store() == [] and len(sources.from_peers()) == 2
    assert (fetch.counts.from_peers, fetch.counts.from_store) == (2, 0)
    # What it fetched it now serves, by content.
    assert fetch.held.path(digest(WEIGHTS)) == directory / "adapter_model.safetensors"
    (directory / "adapter_model.safetensors").unlink()
    assert fetch.held.path(digest(WEIGHTS)) is None
    assert fetch.held.path(digest(b"other")) is None


async def test_callers_asking_for_one_version_at_once_share_one_fetch(
    sources: Sources, tmp_path: Path
) -> None:
    fetch = fetcher(sources, tmp_path)
    first, second = await asyncio.gather(fetch.materialize(version()), fetch.materialize(version()))
    assert first == second and (first / "adapter_model.safetensors").read_bytes() == WEIGHTS
    assert sorted(sources.from_store()) == ["adapter_config.json", "adapter_model.safetensors"]


async def test_a_gone_lying_or_empty_peer_is_passed_over_for_the_next_source(
    sources: Sources, tmp_path: Path
) -> None:
    sources.broken.add(PEER_A)
    sources.peer_blobs[PEER_B] = {
        digest(CONFIG): CONFIG,
        digest(WEIGHTS): b"x" * len(WEIGHTS),
    }  # other bytes
    fetch = fetcher(sources, tmp_path, PEER_A, PEER_B)
    directory = await fetch.materialize(version())
    assert (directory / "adapter_model.safetensors").read_bytes() == WEIGHTS  # hash-checked
    assert (directory / "adapter_config.json").read_bytes() == CONFIG
    assert sources.from_store() == ["adapter_model.safetensors"]  # B sent the config
    assert not list(directory.glob(".*.part"))
    # A peer that failed once is not asked for the version's other files.
    assert [host for host, _ in sources.from_peers()].count(PEER_A) == ATTEMPTS  # one file


async def test_a_cut_transfer_resumes_where_it_stopped(sources: Sources, tmp_path: Path) -> None:
    sources.peer_blobs[PEER_A] = {digest(CONFIG): CONFIG, digest(WEIGHTS): WEIGHTS}
    dest = tmp_path / "cache" / "j1" / "3"
    dest.mkdir(parents=True)
    (dest / ".adapter_model.safetensors.part").write_bytes(WEIGHTS[:5000])  # an earlier try
    await fetcher(sources, tmp_path, PEER_A).materialize(version())
    assert (dest / "adapter_model.safetensors").read_bytes() == WEIGHTS
    assert (PEER_A, "bytes=5000-") in sources.from_peers()


async def test_the_stores_directory_is_read_in_place_only_when_asked(
    sources: Sources, tmp_path: Path
) -> None:
    local = tmp_path / "store" / "j1" / "3"
    local.mkdir(parents=True)
    (local / "adapter_config.json").write_bytes(CONFIG)
    (local / "adapter_model.safetensors").write_bytes(WEIGHTS)
    assert await fetcher(sources, tmp_path, in_place=True).materialize(version(local)) == local
    assert sources.asked == []
    copied = await fetcher(sources, tmp_path).materialize(version(local))
    assert copied == tmp_path / "cache" / "j1" / "3" and len(sources.from_store()) == 2
    # Complete already: nothing is asked again.
    sources.asked.clear()
    assert await fetcher(sources, tmp_path).materialize(version(local)) == copied
    assert sources.asked == []


async def test_the_gateway_says_where_to_fetch_from_and_its_absence_means_the_store() -> None:
    asked: list[tuple[str, bytes]] = []

    def gateway(request: httpx2.Request) -> httpx2.Response:
        asked.append((request.url.path, request.content))
        return httpx2.Response(200, json={"sources": [PEER_B, PEER_A]})

    client = GatewayReplicas("http://gw", transport=httpx2.MockTransport(gateway))
    assert await GatewayPeers(client, "r1").sources("j1", 3) == [PEER_B, PEER_A]
    assert asked == [("/v1/internal/replicas/r1/fetches", b'{"job_id":"j1","number":3}')]

    def down(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("refused", request=request)

    unreachable = GatewayReplicas("http://gw", retries=0, transport=httpx2.MockTransport(down))
    assert await GatewayPeers(unreachable, "r1").sources("j1", 3) == []
