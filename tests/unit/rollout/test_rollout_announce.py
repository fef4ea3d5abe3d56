"""A rollout replica's heartbeat to the gateway, against a gateway stand-in transport: what it
sends, a gateway that is down (logged once, never raised), and leaving."""

from __future__ import annotations

import json
import logging

import httpx2
import pytest

from services.rollout.announce import Announcer
from services.rollout.gateway_calls import GatewayReplicas
from services.rollout.schemas import LoadedVersion, ReplicaHeartbeat, ReplicaPublic


def announcer(handler: httpx2.MockTransport) -> Announcer:
    client = GatewayReplicas("http://gateway", retries=0, transport=handler)
    state = ReplicaHeartbeat(
        url="http://127.0.0.1:9001",
        ready=True,
        heartbeat_s=0.5,
        versions=[LoadedVersion(job_id=None, number=0, kind="base")],
        requests_in_flight=2,
        tokens_in_flight=300,
    )
    return Announcer(client, "127.0.0.1:9001", 0.5, lambda: state)


def answer(request: httpx2.Request) -> httpx2.Response:
    """The gateway's answer: 200 and the replica as it routes to it, 204 to a DELETE."""
    if request.method == "DELETE":
        return httpx2.Response(204)
    state = ReplicaHeartbeat.model_validate_json(request.content)
    return httpx2.Response(
        200,
        json=ReplicaPublic(
            id="127.0.0.1:9001",
            static=False,
            set_aside=False,
            gateway_in_flight=0,
            routed=0,
            failures=0,
            last_heartbeat_s_ago=0.0,
            **state.model_dump(),
        ).model_dump(mode="json"),
    )


async def test_a_heartbeat_puts_the_replica_state_and_leaving_deletes_it() -> None:
    seen: list[tuple[str, str, dict]] = []

    def gateway(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content) if request.content else {}
        seen.append((request.method, request.url.raw_path.decode(), body))
        return answer(request)

    replica = announcer(httpx2.MockTransport(gateway))
    await replica.beat()
    await replica.leave()
    assert [(m, p) for m, p, _ in seen] == [
        ("PUT", "/v1/internal/replicas/127.0.0.1%3A9001"),
        ("DELETE", "/v1/internal/replicas/127.0.0.1%3A9001"),
    ]
    assert seen[0][2]["requests_in_flight"] == 2 and seen[0][2]["ready"] is True
    assert replica.registered


async def test_a_gateway_that_is_down_is_logged_once_and_beats_resume(
    caplog: pytest.LogCaptureFixture,
) -> None:
    up = False

    def gateway(request: httpx2.Request) -> httpx2.Response:
        if not up:
            raise httpx2.ConnectError("refused", request=request)
        return answer(request)

    replica = announcer(httpx2.MockTransport(gateway))
    with caplog.at_level(logging.INFO, logger="services.rollout.announce"):
        for _ in range(3):
            await replica.beat()
        assert not replica.registered
        up = True
        await replica.beat()
    assert replica.registered
    messages = [r.getMessage() for r in caplog.records]
    assert sum("cannot register" in m for m in messages) == 1, messages
    assert sum("registered with the gateway" in m for m in messages) == 1, messages
    await replica.leave()  # a refused or failed leave is not raised either


async def test_a_drained_replica_leaves_and_beats_no_more() -> None:
    methods: list[str] = []

    def gateway(request: httpx2.Request) -> httpx2.Response:
        methods.append(request.method)
        return answer(request)

    replica = announcer(httpx2.MockTransport(gateway))
    await replica.beat()
    await replica.drain()
    await replica.run()  # returns at once: no heartbeat re-registers a drained replica
    assert methods == ["PUT", "DELETE"]
