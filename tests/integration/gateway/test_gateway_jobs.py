"""Jobs through a real gateway on SQLite and PostgreSQL.

The trainer here is a stand-in app serving only `POST /v1/models` with the trainer's real
request schema (`tests/support/trainer.py`): enough for the job logic, which needs nothing
else from the trainer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.app import create_app
from gateway.auth.keys import create_job_key
from services.common.db import make_engine, make_sessionmaker, transaction

if TYPE_CHECKING:
    from tests.integration.gateway.conftest import Serve, Stack


async def test_create_get_list_jobs(stack: Stack) -> None:
    async with stack.client() as admin:
        created = await admin.post(
            "/v1/jobs",
            json={
                "name": "arith",
                "base_model": "loom/tiny",
                "lora": {"rank": 4},
                "config": {"group_size": 8},
            },
        )
        assert created.status_code == 201, created.text
        job = created.json()
        assert job["id"].startswith("job_") and job["status"] == "running"
        assert job["lora"]["rank"] == 4 and job["config"] == {"group_size": 8}
        sent = stack.trainer.state.created[-1]
        assert (sent.job_id, sent.base_model, sent.lora.rank) == (job["id"], "loom/tiny", 4)

        full = await admin.post("/v1/jobs", json={"base_model": "loom/tiny", "mode": "full"})
        assert full.status_code == 201 and full.json()["lora"] is None

        assert (await admin.get(f"/v1/jobs/{job['id']}")).json() == job
        listed = (await admin.get("/v1/jobs")).json()["jobs"]
        assert {j["id"] for j in listed} == {job["id"], full.json()["id"]}

        missing = await admin.get("/v1/jobs/job_nope")
        assert missing.status_code == 404
        assert "job_nope" in missing.json()["error"]["message"]


async def test_trainer_refusal_fails_the_job(stack: Stack) -> None:
    async with stack.client() as admin:
        refused = await admin.post("/v1/jobs", json={"base_model": "/missing/model"})
        assert refused.status_code == 422
        error = refused.json()["error"]
        assert "does not exist" in error["message"]
        job_id = error["detail"]["job_id"]
        assert (await admin.get(f"/v1/jobs/{job_id}")).json()["status"] == "failed"


async def test_trainer_unreachable_is_503_and_fails_the_job(stack: Stack, serve: Serve) -> None:
    settings = stack.settings.model_copy(update={"trainer_url": stack.settings.sandbox_url})
    with serve(create_app(settings)) as url:
        async with stack.client() as admin:
            admin.base_url = url
            response = await admin.post("/v1/jobs", json={"base_model": "loom/tiny"})
            assert response.status_code == 503
            assert "trainer" in response.json()["error"]["message"]
            job_id = response.json()["error"]["detail"]["job_id"]
            assert (await admin.get(f"/v1/jobs/{job_id}")).json()["status"] == "failed"


async def test_jobs_are_private_to_their_key_and_follow_the_state_machine(stack: Stack) -> None:
    async with stack.client() as admin:
        alice = (await admin.post("/v1/keys", json={"name": "alice"})).json()["key"]
        bob = (await admin.post("/v1/keys", json={"name": "bob"})).json()["key"]
    async with stack.client(alice) as as_alice, stack.client(bob) as as_bob:
        job = (await as_alice.post("/v1/jobs", json={"base_model": "loom/tiny"})).json()
        assert (await as_bob.get(f"/v1/jobs/{job['id']}")).status_code == 404
        assert (await as_bob.get("/v1/jobs")).json()["jobs"] == []
        assert [j["id"] for j in (await as_alice.get("/v1/jobs")).json()["jobs"]] == [job["id"]]

        done = await as_alice.post(f"/v1/jobs/{job['id']}/status", json={"status": "completed"})
        assert done.status_code == 200 and done.json()["status"] == "completed"
        again = await as_alice.post(f"/v1/jobs/{job['id']}/status", json={"status": "running"})
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "invalid_transition"
    async with stack.client() as admin:  # admins see every job
        assert job["id"] in {j["id"] for j in (await admin.get("/v1/jobs")).json()["jobs"]}


async def test_a_job_key_acts_for_its_one_job_only(stack: Stack) -> None:
    """The key a managed run gets: its owner's rights on one job, nothing else."""
    async with stack.client() as admin:
        alice = (await admin.post("/v1/keys", json={"name": "alice"})).json()["key"]
    async with stack.client(alice) as as_alice:
        mine, other = [
            (await as_alice.post("/v1/jobs", json={"base_model": "loom/tiny"})).json()["id"]
            for _ in range(2)
        ]
    engine = make_engine(stack.settings.database_url_for("gateway"))
    try:
        with transaction(make_sessionmaker(engine)) as session:
            secret = create_job_key(session, mine, "managed run")
    finally:
        engine.dispose()
    async with stack.client(secret) as as_job:
        assert [j["id"] for j in (await as_job.get("/v1/jobs")).json()["jobs"]] == [mine]
        assert (await as_job.get(f"/v1/jobs/{mine}")).status_code == 200
        logged = await as_job.post(
            f"/v1/jobs/{mine}/metrics", json={"points": [{"step": 1, "name": "loss", "value": 1.0}]}
        )
        assert logged.status_code == 200
        assert (await as_job.get(f"/v1/jobs/{other}")).status_code == 404
        refused = await as_job.post(
            f"/v1/jobs/{other}/metrics",
            json={"points": [{"step": 1, "name": "loss", "value": 1.0}]},
        )
        assert refused.status_code == 404
        created = await as_job.post("/v1/jobs", json={"base_model": "loom/tiny"})
        assert created.status_code == 403 and "job key" in created.json()["error"]["message"]
        assert (await as_job.get("/v1/keys")).status_code == 403


async def test_malformed_job_requests_get_422(stack: Stack) -> None:
    async with stack.client() as admin:
        for body in (
            {},
            {"base_model": ""},
            {"base_model": "m", "mode": "half"},
            {"base_model": "m", "lora": {"rank": 0}},
            {"base_model": "m", "extra": 1},
            {"base_model": "m", "config": []},
        ):
            response = await admin.post("/v1/jobs", json=body)
            assert response.status_code == 422, body
            assert response.json()["error"]["code"] == "invalid_input"
        assert not stack.trainer.state.created  # nothing reached the trainer
        bad_status = await admin.post("/v1/jobs/job_x/status", json={"status": "asleep"})
        assert bad_status.status_code == 422
        assert (
            await admin.post("/v1/jobs", content=b"[", headers={"Content-Type": "application/json"})
        ).status_code == 422


async def test_ensure_model_answers_4xx_for_jobs_out_of_reach(stack: Stack) -> None:
    async with stack.client() as admin:
        bob = (await admin.post("/v1/keys", json={"name": "bob"})).json()["key"]
        job = (await admin.post("/v1/jobs", json={"base_model": "loom/tiny"})).json()
        rebuilt = await admin.post(f"/v1/jobs/{job['id']}/model")
        assert rebuilt.status_code == 200 and rebuilt.json()["job_id"] == job["id"]
        missing = await admin.post("/v1/jobs/job_nope/model")
        assert missing.status_code == 404 and "job_nope" in missing.json()["error"]["message"]
    async with stack.client(bob) as as_bob:
        assert (await as_bob.post(f"/v1/jobs/{job['id']}/model")).status_code == 404
