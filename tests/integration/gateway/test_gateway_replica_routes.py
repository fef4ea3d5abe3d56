"""The replica routes refuse whoever may not use them, and bad input changes nothing: the
heartbeat needs the service token (an API key, even the admin's, is not one), the routing
table is for admins, a fetch claim for the replicas (the token, a registered id), malformed
ids and bodies are 4xx."""

from __future__ import annotations

import http.client
import json
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from services.common.service_token import SERVICE_TOKEN_HEADER, service_token

if TYPE_CHECKING:
    from tests.integration.gateway.conftest import Stack

BEAT = {"url": "http://127.0.0.1:9", "ready": True, "heartbeat_s": 30}


async def test_replica_routes_refuse_bad_callers_and_bad_input(stack: Stack) -> None:
    token = {SERVICE_TOKEN_HEADER: service_token(stack.settings)}
    async with stack.client() as admin:
        user_key = (await admin.post("/v1/keys", json={"name": "user"})).json()["key"]
        for headers in ({}, {SERVICE_TOKEN_HEADER: "forged"}):
            refused = await admin.put("/v1/internal/replicas/r1", json=BEAT, headers=headers)
            assert refused.status_code == 401, refused.text
        for replica_id in ("%2e%2e", "a%2Fb", "a%00b", "x" * 200):
            bad = await admin.put(f"/v1/internal/replicas/{replica_id}", json=BEAT, headers=token)
            assert 400 <= bad.status_code < 500, (replica_id, bad.text)
        for body in (
            {**BEAT, "url": "file:///etc/passwd"},
            {**BEAT, "heartbeat_s": -1},
            {**BEAT, "requests_in_flight": -3},
            {"url": BEAT["url"]},
        ):
            bad = await admin.put("/v1/internal/replicas/r1", json=body, headers=token)
            assert bad.status_code == 422, (body, bad.text)
        assert _raw_put(stack, "/v1/internal/replicas/..", token) // 100 == 4
        assert [
            r
            for r in (await admin.get("/v1/rollout/replicas")).json()["replicas"]
            if not r["static"]
        ] == []

        beat = await admin.put("/v1/internal/replicas/r1", json=BEAT, headers=token)
        assert beat.status_code == 200, beat.text
        async with stack.client(user_key) as user:
            assert (await user.get("/v1/rollout/replicas")).status_code == 403
            assert (await user.delete("/v1/internal/replicas/r1")).status_code == 401
        assert (await admin.delete("/v1/internal/replicas/r2", headers=token)).status_code == 404
        listed = (await admin.get("/v1/rollout/replicas")).json()["replicas"]
        assert [r["id"] for r in listed if not r["static"]] == ["r1"]
        # A replica claiming a version's fetch (where from) takes the token, a registered id
        # and a valid version.
        claim = {"job_id": "j1", "number": 1}
        assert (await admin.post("/v1/internal/replicas/r1/fetches", json=claim)).status_code == 401
        async with stack.client(user_key) as user:
            refused = await user.post("/v1/internal/replicas/r1/fetches", json=claim)
            assert refused.status_code == 401
        for body in ({"job_id": "j1", "number": 0}, {"job_id": "../x", "number": 1}, {}):
            bad = await admin.post("/v1/internal/replicas/r1/fetches", json=body, headers=token)
            assert bad.status_code == 422, (body, bad.text)
        unknown = await admin.post("/v1/internal/replicas/r9/fetches", json=claim, headers=token)
        assert unknown.status_code == 404 and "heartbeat" in unknown.json()["error"]["message"]
        sources = await admin.post("/v1/internal/replicas/r1/fetches", json=claim, headers=token)
        assert sources.status_code == 200, sources.text
        assert sources.json() == {"sources": []}


def _raw_put(stack: Stack, path: str, headers: dict[str, str]) -> int:
    """A PUT whose path is sent as written (HTTP clients remove dot segments themselves)."""
    where = urlsplit(stack.url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    try:
        connection.request(
            "PUT",
            path,
            body=json.dumps(BEAT),
            headers={**headers, "Content-Type": "application/json"},
        )
        return connection.getresponse().status
    finally:
        connection.close()
