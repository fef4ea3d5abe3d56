"""The rollout replica registry and routing policy, on fake replicas (no network): heartbeats,
expiry and return, version affinity, least outstanding work, stickiness, `latest`."""

from __future__ import annotations

import json

import httpx2
import pytest

from gateway.proxy.replicas import ReplicaRegistry
from gateway.proxy.routing import RouteKey, order, reads_body, route_key
from gateway.proxy.upstreams import replicas_health
from services.rollout.schemas import LoadedVersion, ReplicaHeartbeat

STATIC = "http://127.0.0.1:8001"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def registry(clock: Clock, static: str | None = STATIC) -> ReplicaRegistry:
    return ReplicaRegistry(
        static, lambda url: httpx2.AsyncClient(base_url=url), missed_heartbeats=3, clock=clock
    )


def beat(
    port: int, *held: tuple[str | None, int], ready: bool = True, requests: int = 0
) -> ReplicaHeartbeat:
    versions = [
        LoadedVersion(job_id=job, number=n, kind="base" if job is None else "lora")
        for job, n in held
    ]
    return ReplicaHeartbeat(
        url=f"http://127.0.0.1:{port}",
        ready=ready,
        versions=versions,
        requests_in_flight=requests,
        heartbeat_s=1.0,
    )


def ids(replicas: list) -> list[str]:
    return [r.id for r in replicas]


def test_the_static_url_serves_until_a_replica_registers() -> None:
    replicas = registry(Clock())
    assert ids(replicas.candidates()) == ["static"]
    replicas.heartbeat("a", beat(9001))
    assert ids(replicas.candidates()) == ["a"]
    assert [r.url for r in replicas.public()] == ["http://127.0.0.1:9001"]


def test_no_static_url_and_no_replica_means_no_candidate() -> None:
    assert registry(Clock(), static=None).candidates() == []


def test_a_silent_replica_is_dropped_and_comes_back_with_its_heartbeat() -> None:
    clock = Clock()
    replicas = registry(clock)
    replicas.heartbeat("a", beat(9001))
    replicas.heartbeat("b", beat(9002))
    clock.now += 2.5
    replicas.heartbeat("b", beat(9002))
    clock.now += 1.0  # a: 3.5 s silent, more than 3 heartbeats of 1 s
    assert ids(replicas.candidates()) == ["b"]
    replicas.heartbeat("a", beat(9001))
    assert sorted(ids(replicas.candidates())) == ["a", "b"]


def test_starting_replicas_serve_only_when_none_is_ready() -> None:
    replicas = registry(Clock())
    replicas.heartbeat("a", beat(9001, ready=False))
    assert ids(replicas.candidates()) == ["a"]  # its own 503 says it is warming up
    replicas.heartbeat("b", beat(9002))
    assert ids(replicas.candidates()) == ["b"]


def test_an_unreachable_replica_is_set_aside_until_its_next_heartbeat() -> None:
    replicas = registry(Clock())
    a = replicas.heartbeat("a", beat(9001))
    replicas.heartbeat("b", beat(9002))
    replicas.set_aside(a)
    assert ids(replicas.candidates()) == ["b"]
    replicas.heartbeat("a", beat(9001))
    assert sorted(ids(replicas.candidates())) == ["a", "b"]
    assert a.failures == 1


def test_a_replica_that_leaves_gets_nothing_more() -> None:
    replicas = registry(Clock())
    replicas.heartbeat("a", beat(9001))
    replicas.heartbeat("b", beat(9002))
    assert replicas.leave("a")
    assert not replicas.leave("a")
    assert ids(replicas.candidates()) == ["b"]


def test_replicas_holding_the_version_come_first() -> None:
    replicas = registry(Clock())
    replicas.heartbeat("a", beat(9001, (None, 0), ("j", 3)))
    replicas.heartbeat("b", beat(9002, (None, 0), ("j", 4)))
    pick = order(replicas.candidates(), RouteKey("j", 4), replicas.newest, turn=0)
    assert ids(pick) == ["b", "a"]
    pick = order(replicas.candidates(), RouteKey("j", "3"), replicas.newest, turn=1)
    assert ids(pick) == ["a", "b"]


def test_latest_prefers_the_newest_version_any_replica_holds() -> None:
    replicas = registry(Clock())
    replicas.heartbeat("a", beat(9001, ("j", 5)))
    replicas.heartbeat("b", beat(9002, ("j", 6)))
    assert replicas.newest("j") == 6
    for turn in range(4):
        assert order(replicas.candidates(), RouteKey("j"), replicas.newest, turn)[0].id == "b"
    # A job no replica holds a version of: its latest is the base model.
    assert RouteKey("k").wanted(replicas.newest) == (None, 0)


def test_least_outstanding_work_then_a_rotating_turn() -> None:
    replicas = registry(Clock())
    a = replicas.heartbeat("a", beat(9001))
    replicas.heartbeat("b", beat(9002, requests=3))  # reported by the replica
    replicas.heartbeat("c", beat(9003))
    a.in_flight = 2  # this gateway's own requests
    assert ids(order(replicas.candidates(), RouteKey(), replicas.newest, 0)) == ["c", "a", "b"]
    a.in_flight = 0
    firsts = {order(replicas.candidates(), RouteKey(), replicas.newest, t)[0].id for t in range(3)}
    assert firsts == {"a", "c"}  # equals take turns


def test_an_affinity_key_sticks_to_one_replica_while_it_lives() -> None:
    replicas = registry(Clock())
    for index, name in enumerate("abcd"):
        replicas.heartbeat(name, beat(9001 + index))
    keys = [f"episode-{n}" for n in range(40)]
    first = {
        k: order(replicas.candidates(), RouteKey(affinity=k), replicas.newest, 0)[0].id
        for k in keys
    }
    assert len(set(first.values())) > 1  # keys spread over replicas
    replicas.candidates()[0].in_flight = 50  # load does not move a sticky key
    again = {
        k: order(replicas.candidates(), RouteKey(affinity=k), replicas.newest, 7)[0].id
        for k in keys
    }
    assert again == first
    replicas.leave("a")  # only the keys of the replica that left move
    after = {
        k: order(replicas.candidates(), RouteKey(affinity=k), replicas.newest, 0)[0].id
        for k in keys
    }
    assert {k for k in keys if after[k] != first[k]} == {k for k in keys if first[k] == "a"}


@pytest.mark.parametrize(
    ("segments", "body", "expected"),
    [
        (("sample",), {"job_id": "j", "version": 3}, RouteKey("j", 3)),
        (("sample",), {"prompts": [[1]]}, RouteKey(None, "latest")),
        (("sample", "batch"), {"job_id": "j", "version": 2, "prompts": ["a"]}, RouteKey("j", 2)),
        (("rollouts",), {"job_id": "j"}, RouteKey("j", "latest")),
        (("chat", "completions"), {"model": "j@7"}, RouteKey("j", "7")),
        (("completions",), {"model": "j"}, RouteKey("j", "latest")),
        (("completions",), {"model": "loom/tiny"}, RouteKey(None, 0)),
        (("completions",), {"model": "base"}, RouteKey(None, 0)),
        (("trajectories", "t1", "chat", "completions"), {"model": "x"}, RouteKey(affinity="t1")),
    ],
)
def test_route_key_reads_the_version_a_call_asks_for(
    segments: tuple[str, ...], body: dict, expected: RouteKey
) -> None:
    assert route_key(segments, json.dumps(body).encode(), None) == expected


def test_route_key_of_a_bad_body_and_the_affinity_header() -> None:
    assert route_key(("sample",), b"not json", "ep-1") == RouteKey(affinity="ep-1")
    assert route_key(("sample",), b"[1, 2]", None) == RouteKey()
    assert reads_body("POST", ("sample",)) and not reads_body("GET", ("versions",))
    assert reads_body("POST", ("sample", "batch"))
    assert not reads_body("POST", ("trajectories",))


def test_rollout_health_comes_from_the_registered_replicas() -> None:
    replicas = registry(Clock())
    replicas.heartbeat("a", beat(9001, ready=False))
    assert replicas_health(replicas.live()).status == "starting"
    replicas.heartbeat("b", beat(9002))
    health = replicas_health(replicas.live())
    assert health.status == "ready" and health.detail == {"replicas": 2, "ready": ["b"]}


def test_replicas_claiming_a_version_at_once_are_chained_each_to_the_one_before() -> None:
    clock = Clock()
    replicas = registry(clock)
    for port in (9001, 9002, 9003, 9004):
        replicas.heartbeat(str(port), beat(port))
    v1 = ("j1", 1)
    assert replicas.claim("9001", v1) == []  # the first goes to the store
    assert replicas.claim("9002", v1) == ["http://127.0.0.1:9001"]
    assert replicas.claim("9003", v1) == ["http://127.0.0.1:9002", "http://127.0.0.1:9001"]
    assert replicas.claim("ghost", v1) is None  # never beat: not registered
    # Another version has a chain of its own.
    assert replicas.claim("9003", ("j1", 2)) == []
    # One set aside (a connection failed) or gone silent is left out; a replica claiming
    # again (its fetch failed) moves to the end of the chain.
    replicas.set_aside(replicas.live()[1])  # 9002
    assert replicas.claim("9001", v1) == ["http://127.0.0.1:9003"]
    clock.now += 2.5
    for port in (9001, 9002, 9004):
        replicas.heartbeat(str(port), beat(port))
    clock.now += 1.0  # 9003 silent for 3.5 heartbeats
    assert replicas.claim("9004", v1) == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]


def test_replicas_holding_a_version_serve_it_after_its_chain_least_loaded_first() -> None:
    replicas = registry(Clock())
    replicas.heartbeat("busy", beat(9001, ("j1", 1), requests=5))
    replicas.heartbeat("idle", beat(9002, ("j1", 1)))
    replicas.heartbeat("starting", beat(9003, ("j1", 1), ready=False))
    replicas.heartbeat("new", beat(9004))
    replicas.heartbeat("newer", beat(9005))
    assert replicas.claim("new", ("j1", 1)) == ["http://127.0.0.1:9002", "http://127.0.0.1:9001"]
    assert replicas.claim("newer", ("j1", 1)) == [
        "http://127.0.0.1:9004",
        "http://127.0.0.1:9002",
        "http://127.0.0.1:9001",
    ]
    assert replicas.claim("idle", ("j1", 1)) == [
        "http://127.0.0.1:9005",
        "http://127.0.0.1:9004",
        "http://127.0.0.1:9001",
    ]
