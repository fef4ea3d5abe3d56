"""Tinker's and Weaver's APIs on real gateways (uvicorn), installed by `gateway.compat`:
their SDKs' ways of presenting a key and reading a refusal, and two gateway replicas on one
database (SQLite and PostgreSQL) serving one SDK client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import httpx2
import pytest

from gateway.app import create_app
from gateway.settings import GatewaySettings
from services.common.ports import free_port
from tests.support.servers import serve_in_thread
from tests.support.trainer import FakeTrainer

if TYPE_CHECKING:
    from tests.integration.gateway.conftest import Stack


async def test_each_sdk_presents_its_key_and_reads_a_refusal_its_own_way(stack: Stack) -> None:
    async with httpx2.AsyncClient(base_url=stack.url) as anonymous:
        refused = await anonymous.get("/weaver/api/v1/sessions/ws-1")
        assert refused.status_code == 401 and refused.headers["WWW-Authenticate"] == "Bearer"
        body = refused.json()
        assert (body["error"], body["retryable"]) == ("unauthorized", False)
        assert "WEAVER_API_KEY" in body["message"]  # the hint Weaver's layer registered
        loom = await anonymous.get("/v1/jobs")
        assert loom.json()["error"]["code"] == "unauthorized"
        assert "WEAVER_API_KEY" in loom.json()["error"]["message"]

        tinker = await anonymous.post(
            "/api/v1/create_session", headers={"X-API-Key": f"tml-{stack.admin_key}"}
        )
        assert tinker.status_code == 200 and tinker.json()["type"] == "create_session"
        weaver = await anonymous.post(
            "/weaver/api/v1/sessions",
            json={"name": "exp"},
            headers={"X-Weaver-Api-Key": stack.admin_key},
        )
        assert weaver.status_code == 201 and weaver.json()["name"] == "exp"


@pytest.fixture
def two_gateways(gateway_settings: GatewaySettings) -> Iterator[tuple[str, str, str, FakeTrainer]]:
    """Two gateway replicas on one database, before one recording trainer (which also
    answers rollout's GET /v1/versions): their URLs, the admin key and the trainer."""
    fake = FakeTrainer()
    with serve_in_thread(fake.app) as trainer_url:
        unreachable = f"http://127.0.0.1:{free_port()}"
        settings = gateway_settings.model_copy(
            update={
                "trainer_url": trainer_url,
                "rollout_url": trainer_url,
                "reward_url": unreachable,
                "sandbox_url": unreachable,
                "modelstate_url": unreachable,
            }
        )
        with (
            serve_in_thread(create_app(settings)) as first,
            serve_in_thread(create_app(settings)) as second,
        ):
            yield first, second, settings.admin_key_file.read_text().strip(), fake


async def test_two_gateway_replicas_serve_one_sdk_client(
    two_gateways: tuple[str, str, str, FakeTrainer],
) -> None:
    first, second, key, fake = two_gateways
    tinker = {"X-API-Key": f"tml-{key}"}
    async with (
        httpx2.AsyncClient(base_url=first, headers=tinker, timeout=120) as a,
        httpx2.AsyncClient(base_url=second, headers=tinker, timeout=120) as b,
    ):
        session = (await a.post("/api/v1/create_session")).json()["session_id"]
        assert (
            await b.post("/api/v1/session_heartbeat", json={"session_id": session})
        ).status_code == 200
        created = (
            await b.post(
                "/api/v1/create_model",
                json={
                    "session_id": session,
                    "model_seq_id": 0,
                    "base_model": "loom/tiny",
                    "lora_config": {"rank": 4},
                },
            )
        ).json()
        # A future made by one replica is answered by the other.
        assert (
            await a.post("/api/v1/retrieve_future", json={"request_id": created["request_id"]})
        ).json() == {"model_id": created["model_id"], "type": "create_model"}
        # A numbered call resent to the other replica (an SDK's retry) is the same call.
        save = {"model_id": created["model_id"], "seq_id": 1, "path": "w1"}
        saved = (await a.post("/api/v1/save_weights_for_sampler", json=save)).json()
        assert (await b.post("/api/v1/save_weights_for_sampler", json=save)).json() == saved
        path = f"tinker://{created['model_id']}/sampler_weights/w1"
        assert (
            await b.post("/api/v1/retrieve_future", json={"request_id": saved["request_id"]})
        ).json()["path"] == path
        assert [action for _, action, _ in fake.calls] == ["save_weights"]
        # Named sampler weights saved through one replica, sampled through the other.
        sampler = (
            await a.post(
                "/api/v1/create_sampling_session",
                json={"session_id": session, "sampling_session_seq_id": 0, "model_path": path},
            )
        ).json()
        found = (await b.get(f"/api/v1/samplers/{sampler['sampling_session_id']}")).json()
        assert found["model_path"] == path
        assert (await b.get(f"/api/v1/sessions/{session}")).json()["sampler_ids"] == [
            sampler["sampling_session_id"]
        ]

    weaver = {"X-Weaver-Api-Key": key}
    async with (
        httpx2.AsyncClient(base_url=f"{first}/weaver/api/v1", headers=weaver, timeout=120) as a,
        httpx2.AsyncClient(base_url=f"{second}/weaver/api/v1", headers=weaver, timeout=120) as b,
    ):
        session = (await a.post("/sessions", json={"name": "exp"})).json()["id"]
        assert (await b.get(f"/sessions/{session}")).json()["name"] == "exp"
        spec = {"model_seq_id": 1, "base_model": "loom/tiny", "lora_config": {"rank": 4}}
        model = (await b.post(f"/sessions/{session}/models", json=spec)).json()
        assert (await a.post(f"/sessions/{session}/models", json=spec)).json() == model
        bound = (
            await a.post(
                f"/sessions/{session}/sampling-sessions",
                json={"sampling_session_seq_id": 0, "base_model": "loom/tiny"},
            )
        ).json()
        assert (await b.get(f"/sampling-sessions/{bound['id']}")).json() == bound
        assert (await b.delete(f"/sampling-sessions/{bound['id']}")).status_code == 204
        assert (await a.get(f"/sampling-sessions/{bound['id']}")).status_code == 404
