"""Tinker's and Weaver's APIs on a real gateway (uvicorn), installed by `gateway.compat`:
their SDKs' ways of presenting a key and reading a refusal."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx2

if TYPE_CHECKING:
    from tests.integration.gateway.conftest import Stack


async def test_each_sdk_presents_its_key_and_reads_a_refusal_its_own_way(stack: Stack
                                                                          ) -> None:
    async with httpx2.AsyncClient(base_url=stack.url) as anonymous:
        refused = await anonymous.get("/weaver/api/v1/sessions/ws-1")
        assert refused.status_code == 401 and refused.headers["WWW-Authenticate"] == "Bearer"
        body = refused.json()
        assert (body["error"], body["retryable"]) == ("unauthorized", False)
        assert "WEAVER_API_KEY" in body["message"]  # the hint Weaver's layer registered
        loom = await anonymous.get("/v1/jobs")
        assert loom.json()["error"]["code"] == "unauthorized"
        assert "WEAVER_API_KEY" in loom.json()["error"]["message"]

        tinker = await anonymous.post("/api/v1/create_session",
                                      headers={"X-API-Key": f"tml-{stack.admin_key}"})
        assert tinker.status_code == 200 and tinker.json()["type"] == "create_session"
        weaver = await anonymous.post("/weaver/api/v1/sessions", json={"name": "exp"},
                                      headers={"X-Weaver-Api-Key": stack.admin_key})
        assert weaver.status_code == 201 and weaver.json()["name"] == "exp"
