"""Replicas that a publish reaches at once fetch a version as a chain: the gateway's claims
(the real registry) point each at the one that claimed before, the store serves each file once,
and a link that is gone is passed over for the one before it. A file still arriving is served
as it grows and the stream stops when its fetch ends without it. Replicas are real blob routes
on `Fetcher`s (ASGI in-process); the store is a fake over HTTP."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest

from gateway.proxy.replicas import ReplicaRegistry
from modelstate.client import ModelStateClient
from modelstate.transfer import part_path
from services.common.app_factory import create_service_app
from services.rollout import routes
from services.rollout.arriving import ArrivalStopped, Arriving, read_as_it_arrives
from services.rollout.fanout import Fetcher
from services.rollout.schemas import ReplicaHeartbeat
from tests.unit.rollout.test_rollout_fanout_sources import CONFIG, WEIGHTS, version

FILES = {"adapter_config.json": CONFIG, "adapter_model.safetensors": WEIGHTS}
STORE = "store.test"


class RegistryPeers:
    """`fanout.Peers` on the gateway's own registry, as `GatewayPeers` reaches it over HTTP."""

    def __init__(self, registry: ReplicaRegistry, replica_id: str) -> None:
        self.registry, self.replica_id = registry, replica_id

    async def sources(self, job_id: str, number: int) -> list[str]:
        return self.registry.claim(self.replica_id, (job_id, number)) or []


class Network(httpx2.AsyncBaseTransport):
    """The store (streams slowly, counts what it serves) and each replica's real app; a host
    in `down` refuses connections."""

    def __init__(self) -> None:
        self.apps: dict[str, httpx2.ASGITransport] = {}
        self.down: set[str] = set()
        self.store_served: Counter[str] = Counter()
        self.asked: list[tuple[str, str]] = []  # (host, path)
        self.store = httpx2.MockTransport(self._store)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        host = request.url.host
        self.asked.append((host, request.url.path))
        if host == STORE:
            return await self.store.handle_async_request(request)
        if host in self.down:
            raise httpx2.ConnectError("refused", request=request)
        return await self.apps[host].handle_async_request(request)

    def _store(self, request: httpx2.Request) -> httpx2.Response:
        name = request.url.path.rsplit("/", 1)[1]
        self.store_served[name] += 1

        async def slowly() -> AsyncIterator[bytes]:
            for start in range(0, len(FILES[name]), 1024):
                await asyncio.sleep(0.001)  # the others claim while it is on its way
                yield FILES[name][start : start + 1024]

        return httpx2.Response(200, content=slowly())


@pytest.fixture
def network() -> Network:
    return Network()


def replicas(network: Network, tmp_path: Path, *names: str) -> dict[str, Fetcher]:
    registry = ReplicaRegistry(None, lambda url: httpx2.AsyncClient())
    fetchers = {}
    for name in names:
        registry.heartbeat(name, ReplicaHeartbeat(url=f"http://{name}", ready=True, heartbeat_s=60))
        fetcher = fetchers[name] = Fetcher(
            ModelStateClient(f"http://{STORE}", transport=network),
            RegistryPeers(registry, name),
            httpx2.AsyncClient(transport=network),
            tmp_path / name,
            in_place=False,
        )
        app = create_service_app("rollout", routers=[routes.router], service_token=None)
        app.state.held_files = fetcher.held
        network.apps[name] = httpx2.ASGITransport(app=app)
    return fetchers


def asked_of(network: Network, host: str) -> int:
    return sum(asked == host for asked, _ in network.asked)


async def test_replicas_preloading_at_once_form_a_chain_and_the_store_serves_each_file_once(
    network: Network, tmp_path: Path
) -> None:
    fetchers = replicas(network, tmp_path, "replica-a", "replica-b", "replica-c")
    directories = await asyncio.gather(*(f.materialize(version()) for f in fetchers.values()))
    for directory in directories:
        assert {p.name: p.read_bytes() for p in directory.iterdir()} == FILES
    assert network.store_served == {name: 1 for name in FILES}
    counts = {name: (f.counts.from_peers, f.counts.from_store) for name, f in fetchers.items()}
    assert counts == {"replica-a": (0, 2), "replica-b": (2, 0), "replica-c": (2, 0)}
    # c fetched from b (the replica that claimed just before it), not from a.
    assert asked_of(network, "replica-b") == 2 and asked_of(network, "replica-a") == 2
    # Every replica now serves the whole files, by content.
    assert all(f.held.arriving == {} for f in fetchers.values())
    assert all(f.held.path(e.sha256) for f in fetchers.values() for e in version().files)


async def test_a_link_that_is_gone_is_passed_over_for_the_one_before_it(
    network: Network, tmp_path: Path
) -> None:
    fetchers = replicas(network, tmp_path, "replica-a", "replica-b", "replica-c")
    a, b, c = fetchers.values()
    network.down.add("replica-b")
    # b claims the version, then dies: c, pointed at b first, goes on to a.
    fetching_a = asyncio.ensure_future(a.materialize(version()))
    while not a.held.arriving:  # served (and claimed) once its files are arriving
        await asyncio.sleep(0)
    assert await b.peers.sources("j1", 3) == ["http://replica-a"]
    await c.materialize(version())
    await fetching_a
    assert network.store_served == {name: 1 for name in FILES}
    assert (c.counts.from_peers, c.counts.from_store) == (2, 0)
    assert asked_of(network, "replica-a") == 2


async def test_an_arriving_file_is_served_as_it_grows_until_it_is_whole(tmp_path: Path) -> None:
    arriving = Arriving(tmp_path / "weights", size=len(WEIGHTS))
    received = bytearray()

    async def read() -> None:
        async for chunk in read_as_it_arrives(arriving, start=1000):
            received.extend(chunk)

    reading = asyncio.ensure_future(read())
    await asyncio.sleep(0.02)  # the reader waits for the part file to appear
    with open(arriving.part, "wb") as part:
        for start in range(0, len(WEIGHTS), 2048):
            part.write(WEIGHTS[start : start + 2048])
            part.flush()
            await asyncio.sleep(0.01)
            if start == 8192:
                # The reader keeps up with the writer: it has what was written so far.
                assert len(received) == start + 2048 - 1000
    part_path(arriving.target).rename(arriving.target)  # verified and renamed meanwhile
    arriving.fetching = False
    await asyncio.wait_for(reading, 5)
    assert bytes(received) == WEIGHTS[1000:]


async def test_a_stream_stops_when_the_fetch_ends_without_the_file_or_drops_it(
    tmp_path: Path,
) -> None:
    never = Arriving(tmp_path / "never", size=10)
    never.fetching = False
    with pytest.raises(ArrivalStopped, match="never arrived"):
        await anext(read_as_it_arrives(never, 0))

    cut = Arriving(tmp_path / "cut", size=len(WEIGHTS))
    cut.part.write_bytes(WEIGHTS[:5000])
    stream = read_as_it_arrives(cut, 0)
    assert await anext(stream) == WEIGHTS[:5000]
    cut.fetching = False  # the fetch gave up: the receiver resumes elsewhere
    with pytest.raises(ArrivalStopped, match="stopped at 5000 bytes"):
        await anext(stream)

    dropped = Arriving(tmp_path / "dropped", size=len(WEIGHTS))
    dropped.part.write_bytes(WEIGHTS[:5000])
    stream = read_as_it_arrives(dropped, 0)
    assert await anext(stream) == WEIGHTS[:5000]
    dropped.part.unlink()  # its check failed: these bytes were wrong
    with pytest.raises(ArrivalStopped):
        await anext(stream)
