"""The gateway in front of the real trainer and reward services (uvicorn in threads): jobs
create the trainer's model, and proxied calls reach the real routes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx2
import pytest

from agents.sdk import (
    AdamParams,
    AsyncLoomClient,
    Conflict,
    Datum,
    LoraConfig,
    NotFound,
    ScoreItem,
    ScoreRequest,
)
from gateway.app import create_app
from gateway.settings import GatewaySettings
from services.reward.app import create_app as create_reward_app
from services.reward.settings import RewardSettings
from services.trainer.app import create_app as create_trainer_app
from services.trainer.settings import TrainerSettings

if TYPE_CHECKING:
    from tests.integration.gateway.conftest import Serve


@pytest.fixture
def real_gateway(tmp_path: Path, serve: Serve) -> Iterator[httpx2.AsyncClient]:
    data_dir = tmp_path / "data"
    trainer = create_trainer_app(TrainerSettings(data_dir=data_dir, trainer_device="cpu"))
    reward = create_reward_app(RewardSettings(data_dir=data_dir))
    with serve(trainer) as trainer_url, serve(reward) as reward_url:
        settings = GatewaySettings(
            data_dir=data_dir, trainer_url=trainer_url, reward_url=reward_url
        )
        with serve(create_app(settings)) as url:
            key = settings.admin_key_file.read_text().strip()
            yield httpx2.AsyncClient(base_url=url, headers={"X-API-Key": key}, timeout=120)


async def test_job_creates_the_trainer_model(
    real_gateway: httpx2.AsyncClient, tiny_model_dir: Path
) -> None:
    async with real_gateway as client:
        created = await client.post(
            "/v1/jobs", json={"base_model": str(tiny_model_dir), "lora": {"rank": 4, "alpha": 8}}
        )
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


async def test_proxy_reaches_the_reward_service(real_gateway: httpx2.AsyncClient) -> None:
    async with real_gateway as client:
        verifiers = await client.get("/v1/reward/verifiers")
        assert verifiers.status_code == 200
        assert "math" in {v["name"] for v in verifiers.json()["verifiers"]}
        scored = await client.post(
            "/v1/reward/score",
            json={"verifier": "math", "items": [{"response": "\\boxed{0.5}", "reference": "1/2"}]},
        )
        assert scored.status_code == 200, scored.text
        assert scored.json()["scores"][0]["reward"] == 1.0
        malformed = await client.post("/v1/reward/score", json={"verifier": "math", "items": []})
        assert malformed.status_code == 422
        assert malformed.json()["error"]["code"] == "invalid_input"
        key = str(client.headers["X-API-Key"])
        async with AsyncLoomClient(str(client.base_url), key) as loom:
            results = (
                await loom.score_batches(
                    [
                        ScoreRequest(
                            verifier="first_integer",
                            items=[ScoreItem(response="= 12 apples", reference="12")],
                        ),
                        ScoreRequest(
                            verifier="regex",
                            params={"pattern": "^a"},
                            items=[ScoreItem(response="b"), ScoreItem(response="a")],
                        ),
                        ScoreRequest(verifier="math", items=[ScoreItem(response="1")]),
                    ]
                )
            ).results
        assert [[s.reward for s in r.scores] for r in results] == [[1.0], [0.0, 1.0], []]
        assert results[2].error is not None and "needs a reference" in results[2].error.message


async def test_a_job_key_reaches_only_its_own_jobs(
    real_gateway: httpx2.AsyncClient, tiny_model_dir: Path
) -> None:
    datum = {"input_ids": [1, 2, 3, 4], "loss_mask": [0, 1, 1, 1]}
    async with real_gateway as admin:
        keys = [
            (await admin.post("/v1/keys", json={"name": n})).json()["key"] for n in ("alice", "bob")
        ]
    alice, bob = (
        httpx2.AsyncClient(
            base_url=str(admin.base_url), timeout=120, headers={"Authorization": f"Bearer {k}"}
        )
        for k in keys
    )
    async with alice, bob:
        job = (
            await alice.post(
                "/v1/jobs", json={"base_model": str(tiny_model_dir), "lora": {"rank": 4}}
            )
        ).json()["id"]
        own = await alice.post(f"/v1/trainer/models/{job}/forward_backward", json={"data": [datum]})
        assert own.status_code == 202, own.text
        operation = await bob.get(f"/v1/trainer/operations/{own.json()['id']}")
        assert operation.status_code == 200  # an operation id works as a capability

        for call in (
            bob.get(f"/v1/trainer/models/{job}"),
            bob.post(f"/v1/trainer/models/{job}/optim_step", json={}),
            bob.get(f"/v1/trainer/models/job%5F{job.removeprefix('job_')}"),
            bob.put(
                "/v1/reward/functions/mine",
                json={"job_id": job, "code": "def reward(response, reference):\n  return 1"},
            ),
            # Duplicate keys: the last one counts, here as in the service.
            bob.post(
                "/v1/reward/score",
                content=(
                    '{"verifier": "math", "items": [{"response": "1", "reference": "1"}], '
                    f'"params": {{"job_id": "job_bobs", "job_id": "{job}"}}}}'
                ).encode(),
                headers={"Content-Type": "application/json"},
            ),
            # A batch may name a job in any of its batches' params.
            bob.post(
                "/v1/reward/score/batch",
                json={
                    "batches": [
                        {"verifier": "exact_match", "items": [{"response": "1", "reference": "1"}]},
                        {
                            "verifier": "python",
                            "params": {"function": "f", "job_id": job},
                            "items": [{"response": "1"}],
                        },
                    ]
                },
            ),
        ):
            refused = await call
            assert refused.status_code == 404, refused.text
            assert job in refused.json()["error"]["message"]
        # Loading another job's checkpoint reads that job: bob's own model is not enough.
        saved = await alice.post(f"/v1/trainer/models/{job}/save_state", json={"name": "c"})
        done = await alice.get(f"/v1/trainer/operations/{saved.json()['id']}", params={"wait": 60})
        assert done.json()["status"] == "succeeded", done.text
        bobs = (
            await bob.post(
                "/v1/jobs", json={"base_model": str(tiny_model_dir), "lora": {"rank": 4}}
            )
        ).json()["id"]
        theirs = await bob.post(
            f"/v1/trainer/models/{bobs}/load_state", json={"name": "c", "job_id": job}
        )
        assert theirs.status_code == 404 and "another API key" in theirs.text, theirs.text
        mine = await alice.post(
            f"/v1/trainer/models/{job}/load_state",
            json={"name": "c", "job_id": job, "optimizer": False},
        )
        assert mine.status_code == 202, mine.text
        forbidden = await bob.post(
            "/v1/trainer/models", json={"job_id": "job_mine", "base_model": str(tiny_model_dir)}
        )
        assert forbidden.status_code == 403
        assert "reserved to admin keys" in forbidden.json()["error"]["message"]
        shared = await bob.put(
            "/v1/reward/functions/shared",
            json={"code": "def reward(response, reference):\n    return 1.0"},
        )
        assert shared.status_code == 403 and "job_id" in shared.json()["error"]["message"]
        not_json = await bob.post(
            "/v1/reward/score", content=b"{", headers={"Content-Type": "application/json"}
        )
        assert not_json.status_code == 422

        scored = await bob.post(
            "/v1/reward/score",
            json={"verifier": "exact_match", "items": [{"response": "4", "reference": "4"}]},
        )
        assert scored.status_code == 200 and scored.json()["scores"][0]["reward"] == 1.0
        assert (await alice.get(f"/v1/trainer/models/{job}")).status_code == 200


async def test_a_job_resumes_from_its_checkpoint_after_a_trainer_restart(
    tmp_path: Path, serve: Serve, tiny_model_dir: Path
) -> None:
    data_dir = tmp_path / "data"
    settings = TrainerSettings(data_dir=data_dir, trainer_device="cpu")
    datum = Datum(input_ids=[3, 4, 5, 6, 7], loss_mask=[0, 1, 1, 1, 1])
    with serve(create_trainer_app(settings)) as trainer_url:
        port = int(trainer_url.rsplit(":", 1)[1])
        gateway_settings = GatewaySettings(data_dir=data_dir, trainer_url=trainer_url)
        with serve(create_app(gateway_settings)) as url:
            key = gateway_settings.admin_key_file.read_text().strip()
            async with AsyncLoomClient(url, key) as admin:
                alice_key = (await admin._http.post_json("/v1/keys", {"name": "alice"}))["key"]
            async with AsyncLoomClient(url, alice_key) as alice:
                job = await alice.create_job(str(tiny_model_dir), lora=LoraConfig(rank=4))
                for _ in range(2):
                    await job.forward_backward([datum])
                    await (await job.optim_step(AdamParams(lr=5e-2))).result()
                saved = await (await job.save_state("after-2")).result()
                at_save = (await (await job.forward([datum])).result()).logprobs
                await job.forward_backward([datum])
                await (await job.optim_step(AdamParams(lr=5e-2))).result()

    with serve(create_trainer_app(settings), port=port), serve(create_app(gateway_settings)) as url:
        async with AsyncLoomClient(url, alice_key) as alice:
            job = await alice.get_job(job.id)
            with pytest.raises(NotFound, match="No model"):
                await job.forward([datum])
            assert (await job.ensure_model()).step == 0
            assert [c.name for c in await job.checkpoints()] == ["after-2"]
            loaded = await (await job.load_state("after-2")).result()
            assert loaded.step == saved.step == 2
            resumed = (await (await job.forward([datum])).result()).logprobs
            assert resumed[0] == pytest.approx(at_save[0], abs=1e-6)
            assert (await job.ensure_model()).step == 2  # a no-op once the model exists
            await job.set_status("completed")
            with pytest.raises(Conflict, match="only a running or paused job"):
                await job.ensure_model()
