"""The database goes away under a running service (its connections dropped, new ones refused,
through a proxy the test controls, never by stopping the shared server): every DB-backed call
is a 503 that says so, nothing half-written, and the service recovers on its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx2
import pytest

from modelstate.app import create_app
from modelstate.settings import ModelStateSettings
from services.common.service_token import service_headers
from tests.support.tcp_proxy import TcpProxy, tcp_proxy


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    with tcp_proxy("127.0.0.1", 5432) as running:
        yield running


async def test_a_database_outage_is_a_503_and_the_service_recovers(
    postgres_url: str, proxy: TcpProxy, tmp_path: Path
) -> None:
    through_proxy = postgres_url.replace(
        f"@{urlsplit(postgres_url).netloc.split('@')[1]}", f"@127.0.0.1:{proxy.port}"
    )
    settings = ModelStateSettings(data_dir=tmp_path / "data", database_url=through_proxy)
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app),
            base_url="http://modelstate",
            headers=service_headers(settings),
        ) as http,
    ):
        assert (await http.get("/v1/jobs/job-1/versions")).status_code == 200
        proxy.cut()
        for path in ("/v1/jobs/job-1/versions", "/v1/jobs/job-1/retention", "/v1/pins"):
            down = await http.get(path)
            assert down.status_code == 503, (path, down.text)
            assert down.json()["error"]["code"] == "unavailable"
            assert "database is unavailable" in down.json()["error"]["message"]
        refused = await http.put("/v1/jobs/job-1/retention", json={"keep_last": 3})
        assert refused.status_code == 503, refused.text
        proxy.restore()
        assert (await http.get("/v1/jobs/job-1/versions")).status_code == 200
        kept = (await http.get("/v1/jobs/job-1/retention")).json()
        assert kept["keep_last"] != 3  # the refused write left nothing behind
        assert (
            await http.put("/v1/jobs/job-1/retention", json={"keep_last": 3})
        ).status_code == 200
