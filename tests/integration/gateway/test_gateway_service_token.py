"""The gateway calls services with the service token, and only with its own: a copy a client
sends is dropped, so knowing (or guessing) the header gets a caller nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx2

from services.common.service_token import SERVICE_TOKEN_HEADER, service_token

if TYPE_CHECKING:
    from tests.integration.gateway.conftest import Stack


async def test_the_service_receives_the_gateways_token_not_the_clients(stack: Stack) -> None:
    async with stack.client() as client:
        response = await client.get(
            "/v1/reward/echo/x", headers={SERVICE_TOKEN_HEADER: "forged-by-the-client"}
        )
    assert response.status_code == 200, response.text
    # The echo service asks for the token itself: this request passed with the real one.
    assert response.json()["headers"][SERVICE_TOKEN_HEADER.lower()] == service_token(stack.settings)


async def test_the_services_refuse_whoever_skips_the_gateway(stack: Stack) -> None:
    async with httpx2.AsyncClient(base_url=stack.settings.reward_url) as direct:
        refused = await direct.get("/v1/echo/x")
        assert refused.status_code == 401
        assert "LOOM_SERVICE_TOKEN" in refused.json()["error"]["message"]
        assert (await direct.get("/healthz")).status_code == 200


async def test_jobs_reach_the_trainer_with_the_token(stack: Stack) -> None:
    """Creating a job calls the trainer (a stand-in that asks for the token, as the real one
    does) from the gateway's own service client, not through the proxy."""
    async with stack.client() as client:
        created = await client.post("/v1/jobs", json={"base_model": "loom/tiny"})
    assert created.status_code == 201, created.text
    assert stack.trainer.state.created
