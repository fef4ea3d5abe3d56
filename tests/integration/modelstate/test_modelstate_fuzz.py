"""Schemathesis against the model-state store's OpenAPI, on PostgreSQL: no 5xx."""

from __future__ import annotations

from pathlib import Path

import httpx2

from modelstate.app import create_app
from modelstate.settings import ModelStateSettings
from services.common.service_token import service_headers
from tests.support.fuzz import fuzz

STREAMS = frozenset({"GET /v1/events"})  # an endless event stream: tested on its own


async def test_generated_requests_get_no_server_error(postgres_url: str, tmp_path: Path) -> None:
    settings = ModelStateSettings(data_dir=tmp_path / "data", database_url=postgres_url)
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app),
            base_url="http://modelstate",
            headers=service_headers(settings),
            timeout=60,
        ) as client,
    ):
        report = await fuzz(client, app.openapi(), skip=STREAMS)
    report.check()
