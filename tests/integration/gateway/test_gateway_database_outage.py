"""The database goes away under the gateway (connections dropped and refused through a proxy
the test controls): a key the auth cache has not seen yet gets a 503 that says so, not a 500
from the auth middleware (outside the app's exception handlers), and the gateway recovers."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import httpx2

from gateway.app import create_app
from gateway.settings import GatewaySettings
from tests.support.servers import serve_in_thread
from tests.support.tcp_proxy import tcp_proxy


def test_an_uncached_key_during_a_database_outage_is_a_503(
    postgres_url: str, tmp_path: Path
) -> None:
    with tcp_proxy("127.0.0.1", 5432) as proxy:
        through_proxy = postgres_url.replace(
            f"@{urlsplit(postgres_url).netloc.split('@')[1]}", f"@127.0.0.1:{proxy.port}"
        )
        settings = GatewaySettings(data_dir=tmp_path / "data", database_url=through_proxy)
        with serve_in_thread(create_app(settings)) as url:
            headers = {"Authorization": f"Bearer {settings.admin_key_file.read_text().strip()}"}
            proxy.cut()
            down = httpx2.get(f"{url}/v1/jobs", headers=headers)
            assert down.status_code == 503, down.text
            assert down.json()["error"]["code"] == "unavailable"
            assert "database is unavailable" in down.json()["error"]["message"]
            proxy.restore()
            assert httpx2.get(f"{url}/v1/jobs", headers=headers).status_code == 200
