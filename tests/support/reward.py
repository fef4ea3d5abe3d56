"""The reward service in-process (lifespan run, so its worker pool is real) for tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from fastapi import FastAPI

from services.common.service_token import service_headers
from services.reward.app import create_app
from services.reward.settings import RewardSettings


@asynccontextmanager
async def reward_app(settings: RewardSettings) -> AsyncIterator[FastAPI]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        yield app


@asynccontextmanager
async def reward_client(settings: RewardSettings) -> AsyncIterator[httpx2.AsyncClient]:
    async with (
        reward_app(settings) as app,
        httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app),
            base_url="http://reward",
            timeout=60,
            headers=service_headers(settings),
        ) as client,
    ):
        yield client


async def score_items(client: httpx2.AsyncClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-item scores of a /v1/score call that must succeed."""
    response = await client.post("/v1/score", json=body)
    assert response.status_code == 200, response.text
    return list(response.json()["scores"])
