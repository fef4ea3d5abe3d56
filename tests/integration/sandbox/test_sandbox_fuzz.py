"""Schemathesis against the sandbox service's OpenAPI, on the process backend (generated code
really runs, in the sandbox): no 5xx."""

from __future__ import annotations

import httpx2

from services.common.service_token import service_headers
from services.sandbox.app import create_app
from tests.support.fuzz import fuzz
from tests.support.sandboxes import sandbox_settings


async def test_generated_requests_get_no_server_error() -> None:
    settings = sandbox_settings("process", sandbox_max_concurrency=2)
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app),
            base_url="http://sandbox",
            headers=service_headers(settings),
            timeout=60,
        ) as client,
    ):
        report = await fuzz(client, app.openapi())
    report.check()
