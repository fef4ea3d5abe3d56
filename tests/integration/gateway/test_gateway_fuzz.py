"""Schemathesis against the gateway's OpenAPI (its own routes, the proxy, the Tinker and
Weaver APIs), as the admin, on PostgreSQL, with no service behind it: no 5xx but the 502/503
that say a service is unreachable."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from huggingface_hub import constants

from gateway.app import create_app
from gateway.settings import GatewaySettings
from services.common.ports import free_port
from services.common.settings import SERVICES
from tests.support.fuzz import fuzz


async def test_generated_requests_get_no_server_error(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # no hub look-up for made-up names
    unreachable = {
        f"{name}_url": f"http://127.0.0.1:{free_port()}" for name in SERVICES if name != "gateway"
    }
    settings = GatewaySettings(data_dir=tmp_path / "data", database_url=postgres_url, **unreachable)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        key = settings.admin_key_file.read_text().strip()
        async with httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app),
            timeout=60,
            base_url="http://gateway",
            headers={"Authorization": f"Bearer {key}"},
        ) as client:
            report = await fuzz(client, app.openapi(), allow_upstream=True)
    report.check()
