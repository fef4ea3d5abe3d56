"""API keys and auth against a real gateway (uvicorn) on SQLite and PostgreSQL."""

from __future__ import annotations

import stat
from typing import TYPE_CHECKING

import httpx2
import pytest
from pydantic import SecretStr

from gateway.app import create_app
from gateway.settings import GatewaySettings

if TYPE_CHECKING:
    from tests.integration.gateway.conftest import Serve, Stack


def test_bootstrap_key_is_created_once(
    gateway_settings: GatewaySettings, serve: Serve, capsys: pytest.CaptureFixture[str]
) -> None:
    with serve(create_app(gateway_settings)) as url:
        secret = gateway_settings.admin_key_file.read_text().strip()
        assert secret.startswith("loom_")
        assert stat.S_IMODE(gateway_settings.admin_key_file.stat().st_mode) == 0o600
        assert secret in capsys.readouterr().err  # printed once, boxed, on stderr
        keys = httpx2.get(f"{url}/v1/keys", headers={"Authorization": f"Bearer {secret}"})
        assert keys.status_code == 200
        assert [k["admin"] for k in keys.json()["keys"]] == [True]

    gateway_settings.admin_key_file.unlink()
    with serve(create_app(gateway_settings)) as url:
        assert not gateway_settings.admin_key_file.exists()  # nothing new created
        assert secret not in capsys.readouterr().err
        keys = httpx2.get(f"{url}/v1/keys", headers={"X-API-Key": secret})
        assert len(keys.json()["keys"]) == 1


def test_configured_admin_key_is_used(gateway_settings: GatewaySettings, serve: Serve) -> None:
    configured = "loom_configured-admin-key-for-tests"
    settings = gateway_settings.model_copy(update={"gateway_admin_key": SecretStr(configured)})
    with serve(create_app(settings)) as url:
        assert not settings.admin_key_file.exists()
        keys = httpx2.get(f"{url}/v1/keys", headers={"Authorization": f"Bearer {configured}"})
        assert keys.status_code == 200
        assert keys.json()["keys"][0]["prefix"] == configured[:12]


def test_configured_admin_key_must_be_long() -> None:
    with pytest.raises(ValueError, match="gateway_admin_key"):
        GatewaySettings(gateway_admin_key="short")  # type: ignore[arg-type]


async def test_requests_without_a_valid_key_get_401(stack: Stack) -> None:
    async with httpx2.AsyncClient(base_url=stack.url) as anonymous:
        for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs"):
            assert (await anonymous.get(path)).status_code == 200, path
        missing = await anonymous.get("/v1/jobs", headers={"X-Request-ID": "req-401"})
        assert missing.status_code == 401
        assert missing.json()["error"]["code"] == "unauthorized"
        assert "Authorization: Bearer" in missing.json()["error"]["message"]
        assert missing.headers["x-request-id"] == "req-401"
        for path in ("/v1/reward/echo/x", "/v1/nowhere", "/v1/health"):
            assert (await anonymous.get(path)).status_code == 401, path
        for method, path in (
            ("PUT", f"/v1/modelstate/blobs/{'0' * 64}"),
            ("DELETE", "/v1/modelstate/jobs/j/versions/1"),
            ("POST", "/v1/modelstate/gc"),
            ("PUT", "/v1/modelstate/pins/x"),
            ("POST", "/v1/sandbox/sessions"),
            ("PUT", "/v1/sandbox/sessions/sbx_1/files"),
            ("PUT", "/v1/reward/functions/f"),
            ("DELETE", "/v1/reward/functions/f"),
            ("POST", "/v1/jobs/j/metrics"),
            ("GET", "/v1/jobs/j/metrics"),
            ("POST", "/v1/jobs/j/samples"),
            ("GET", "/v1/jobs/j/samples"),
            ("POST", "/v1/jobs/j/model"),
            ("POST", "/v1/jobs/j/tasks"),
            ("GET", "/v1/tasks"),
            ("POST", "/v1/tasks/t/cancel"),
            ("POST", "/v1/tasks/t/retry"),
            ("POST", "/v1/trainer/models/j/save_state"),
            ("GET", "/v1/trainer/models/j/checkpoints"),
        ):
            assert (await anonymous.request(method, path)).status_code == 401, path
        bad = await anonymous.get("/v1/jobs", headers={"Authorization": "Bearer loom_wrong"})
        assert bad.status_code == 401
        assert "Invalid or revoked" in bad.json()["error"]["message"]
        assert (
            await anonymous.get("/v1/jobs", headers={"Authorization": "Basic x"})
        ).status_code == 401


async def test_keys_create_list_revoke(stack: Stack) -> None:
    async with stack.client() as admin:
        created = await admin.post("/v1/keys", json={"name": "alice"})
        assert created.status_code == 201
        alice = created.json()
        assert alice["key"].startswith("loom_") and alice["admin"] is False
        assert alice["prefix"] == alice["key"][:12]

        listed = (await admin.get("/v1/keys")).json()["keys"]
        assert [k["name"] for k in listed] == ["bootstrap admin", "alice"]
        assert all("key" not in k for k in listed)  # the secret is never shown again
        assert alice["key"] not in (await admin.get("/v1/keys")).text

    async with stack.client(alice["key"]) as user:
        assert (await user.get("/v1/jobs")).status_code == 200
        for call in (
            user.get("/v1/keys"),
            user.post("/v1/keys", json={"name": "x"}),
            user.delete(f"/v1/keys/{alice['id']}"),
        ):
            forbidden = await call
            assert forbidden.status_code == 403
            assert "not an admin key" in forbidden.json()["error"]["message"]

    async with stack.client() as admin:
        revoked = await admin.delete(f"/v1/keys/{alice['id']}")
        assert revoked.status_code == 200 and revoked.json()["revoked_at"]
        assert (await admin.delete("/v1/keys/key_nope")).status_code == 404
    async with stack.client(alice["key"]) as user:
        assert (await user.get("/v1/jobs")).status_code == 401


async def test_malformed_key_requests_get_422(stack: Stack) -> None:
    async with stack.client() as admin:
        for body in ({}, {"name": ""}, {"name": "x", "admin": "maybe"}, {"name": "x", "y": 1}):
            response = await admin.post("/v1/keys", json=body)
            assert response.status_code == 422, body
            assert response.json()["error"]["code"] == "invalid_input"
        not_json = await admin.post(
            "/v1/keys", content=b"{nope", headers={"Content-Type": "application/json"}
        )
        assert not_json.status_code == 422
