"""The gateway in front of the real trainer and reward services (uvicorn in threads): jobs
create the trainer's model, and proxied calls reach the real routes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from gateway.app import create_app
from gateway.settings import GatewaySettings
from services.reward.app import create_app as create_reward_app
from services.reward.settings import RewardSettings
from services.trainer.app import create_app as create_trainer_app
from services.trainer.settings import TrainerSettings

if TYPE_CHECKING:
    from tests.integration.gateway.conftest import Serve


@pytest.fixture
def real_gateway(tmp_path: Path, serve: Serve) -> Iterator[httpx.AsyncClient]:
    data_dir = tmp_path / "data"
    trainer = create_trainer_app(TrainerSettings(data_dir=data_dir, trainer_device="cpu"))
    reward = create_reward_app(RewardSettings(data_dir=data_dir))
    with serve(trainer) as trainer_url, serve(reward) as reward_url:
        settings = GatewaySettings(data_dir=data_dir, trainer_url=trainer_url,
                                   reward_url=reward_url)
        with serve(create_app(settings)) as url:
            key = settings.admin_key_file.read_text().strip()
            yield httpx.AsyncClient(base_url=url, headers={"X-API-Key": key}, timeout=120)


async def test_job_creates_the_trainer_model(real_gateway: httpx.AsyncClient,
                                             tiny_model_dir: Path) -> None:
    async with real_gateway as client:
        created = await client.post("/v1/jobs", json={
            "base_model": str(tiny_model_dir), "lora": {"rank": 4, "alpha": 8}})
        assert created.status_code == 201, created.text
        job = created.json()
        assert job["status"] == "running"
        model = await client.get(f"/v1/trainer/models/{job['id']}")
        assert model.status_code == 200, model.text
        assert model.json()["job_id"] == job["id"] and model.json()["lora"]["rank"] == 4

        refused = await client.post("/v1/jobs", json={"base_model": str(tiny_model_dir / "no")})
        assert refused.status_code == 422, refused.text
        failed_id = refused.json()["error"]["detail"]["job_id"]
        assert (await client.get(f"/v1/jobs/{failed_id}")).json()["status"] == "failed"


async def test_proxy_reaches_the_reward_service(real_gateway: httpx.AsyncClient) -> None:
    async with real_gateway as client:
        verifiers = await client.get("/v1/reward/verifiers")
        assert verifiers.status_code == 200
        assert "math" in {v["name"] for v in verifiers.json()["verifiers"]}
        scored = await client.post("/v1/reward/score", json={
            "verifier": "math", "items": [{"response": "\\boxed{0.5}", "reference": "1/2"}]})
        assert scored.status_code == 200, scored.text
        assert scored.json()["scores"][0]["reward"] == 1.0
        malformed = await client.post("/v1/reward/score", json={"verifier": "math", "items": []})
        assert malformed.status_code == 422
        assert malformed.json()["error"]["code"] == "invalid_input"
