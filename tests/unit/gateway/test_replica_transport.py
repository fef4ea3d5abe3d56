"""The gateway's own rollout client (Tinker's and Weaver's samples) goes over the replica
routing: the replica holding the version gets the call as it was sent, an unreachable one is
routed around, and the call's count on its replica ends when the answer is read."""

from __future__ import annotations

import json

import httpx2
import pytest

from gateway.proxy.replica_transport import ReplicaTransport
from gateway.proxy.replicas import ReplicaRegistry
from services.common.errors import Unavailable
from services.common.http import ServiceClient
from services.rollout.schemas import LoadedVersion, ReplicaHeartbeat

STATIC = "http://127.0.0.1:8001"
SAMPLE = {"job_id": "j1", "version": 3, "prompt_token_ids": [1, 2]}


class Replicas:
    """Fake replicas by URL: each records what reached it; `down` ones refuse connections."""

    def __init__(self) -> None:
        self.seen: dict[str, list[httpx2.Request]] = {}
        self.down: set[str] = set()

    def client(self, url: str) -> httpx2.AsyncClient:
        def handle(request: httpx2.Request) -> httpx2.Response:
            if url in self.down:
                raise httpx2.ConnectError("connection refused", request=request)
            self.seen.setdefault(url, []).append(request)
            return httpx2.Response(
                200, json={"served_by": url, "body": json.loads(request.content or b"null")}
            )

        return httpx2.AsyncClient(
            base_url=url,
            transport=httpx2.MockTransport(handle),
            headers={"X-Loom-Service-Token": "t"},
        )


def beat(port: int, *held: tuple[str, int]) -> ReplicaHeartbeat:
    return ReplicaHeartbeat(
        url=f"http://127.0.0.1:{port}",
        ready=True,
        heartbeat_s=1.0,
        versions=[
            LoadedVersion(job_id=None, number=0, kind="base"),
            *(LoadedVersion(job_id=job, number=n, kind="lora") for job, n in held),
        ],
    )


@pytest.fixture
def fakes() -> Replicas:
    return Replicas()


def client_over(registry: ReplicaRegistry) -> ServiceClient:
    return ServiceClient(STATIC, service="rollout", transport=ReplicaTransport(registry))


async def test_a_sample_goes_to_the_replica_holding_its_version(fakes: Replicas) -> None:
    registry = ReplicaRegistry(STATIC, fakes.client)
    registry.heartbeat("a", beat(9001))
    b = registry.heartbeat("b", beat(9002, ("j1", 3)))
    rollout = client_over(registry)
    for _ in range(3):
        answer = await rollout.post_json("/v1/sample?x=1", SAMPLE, headers={"X-Caller": "tinker"})
        assert answer == {"served_by": b.url, "body": SAMPLE}
    sent = fakes.seen[b.url][0]
    assert sent.url == httpx2.URL(f"{b.url}/v1/sample?x=1")
    assert sent.headers["host"] == "127.0.0.1:9002"  # not the static URL's
    assert sent.headers["x-caller"] == "tinker" and sent.headers["x-loom-service-token"] == "t"
    assert (b.routed, b.in_flight) == (3, 0)  # counted, and released once read
    await rollout.aclose()


async def test_an_unreachable_replica_is_routed_around(fakes: Replicas) -> None:
    registry = ReplicaRegistry(STATIC, fakes.client)
    a = registry.heartbeat("a", beat(9001, ("j1", 3)))
    b = registry.heartbeat("b", beat(9002))
    fakes.down.add(a.url)
    rollout = client_over(registry)
    assert (await rollout.post_json("/v1/sample", SAMPLE))["served_by"] == b.url
    assert a.set_aside and a.in_flight == 0 and b.in_flight == 0
    fakes.down.add(b.url)
    registry.heartbeat("a", beat(9001))  # back in the table, still refusing
    with pytest.raises(Unavailable, match="unreachable"):
        await rollout.post_json("/v1/sample", SAMPLE)
    await rollout.aclose()


async def test_gets_and_the_static_url_before_any_replica(fakes: Replicas) -> None:
    registry = ReplicaRegistry(STATIC, fakes.client)
    rollout = client_over(registry)
    assert (await rollout.get_json("/v1/versions"))["served_by"] == STATIC
    assert fakes.seen[STATIC][0].method == "GET"
    await rollout.aclose()
