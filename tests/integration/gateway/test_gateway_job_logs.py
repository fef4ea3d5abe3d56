"""Job metrics and samples through a real gateway on SQLite and PostgreSQL, read back through
the SDK (which the web admin's plots and tables use too)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest
from pydantic import ValidationError

from agents.sdk import AsyncLoomClient, Conflict, NotFound

if TYPE_CHECKING:
    from tests.integration.gateway.conftest import Stack


async def test_metrics_upsert_by_step_and_feed_progress(stack: Stack) -> None:
    async with AsyncLoomClient(stack.url, stack.admin_key) as loom:
        job = await loom.create_job("loom/tiny", name="curves")
        assert job.info.progress is None
        for step in range(5):
            await job.log_metrics(step, {"reward": step / 10, "loss": 2.0 - step / 10})
        await job.log_metrics(3, {"reward": 0.95})  # a retried step replaces, never duplicates

        series = await job.metrics()
        assert set(series) == {"reward", "loss"}
        assert series["reward"].steps == [0, 1, 2, 3, 4]
        assert series["reward"].values == pytest.approx([0.0, 0.1, 0.2, 0.95, 0.4])
        assert series["loss"].values == pytest.approx([2.0, 1.9, 1.8, 1.7, 1.6])

        newer = await job.metrics(["loss"], since_step=2)
        assert list(newer) == ["loss"] and newer["loss"].steps == [3, 4]

        fetched = await loom.get_job(job.id)
        assert fetched.info.progress is not None and fetched.info.progress.step == 4
        assert fetched.info.progress.updated_at.tzinfo is not None
        listed = {j["id"]: j for j in (await loom._http.get_json("/v1/jobs"))["jobs"]}
        assert listed[job.id]["progress"]["step"] == 4


async def test_the_last_value_for_a_step_wins_within_one_request(stack: Stack) -> None:
    async with stack.client() as admin:
        job = (await admin.post("/v1/jobs", json={"base_model": "loom/tiny"})).json()
        points = [{"step": 1, "name": "kl", "value": 0.1}, {"step": 1, "name": "kl", "value": 0.3}]
        response = await admin.post(f"/v1/jobs/{job['id']}/metrics", json={"points": points})
        assert response.status_code == 200 and response.json()["accepted"] == 1
        series = (await admin.get(f"/v1/jobs/{job['id']}/metrics")).json()["series"]
        assert series == [{"name": "kl", "steps": [1], "values": [0.3]}]


async def test_concurrent_writers_of_one_step_leave_one_point(stack: Stack) -> None:
    async with AsyncLoomClient(stack.url, stack.admin_key) as loom:
        job = await loom.create_job("loom/tiny")
        await asyncio.gather(*(job.log_metrics(7, {"reward": float(i)}) for i in range(8)))
        series = await job.metrics(["reward"])
        assert series["reward"].steps == [7] and series["reward"].values[0] in range(8)


async def test_samples_are_bounded_newest_first(stack: Stack) -> None:
    kept = stack.settings.gateway_samples_kept_per_job
    async with AsyncLoomClient(stack.url, stack.admin_key) as loom:
        job = await loom.create_job("loom/tiny")
        await job.log_samples(
            [{"step": 0, "prompt": "1+1=", "completion": "2", "reward": 1.0, "version": 0}]
        )
        batch = [
            {"step": 1, "prompt": f"p{i}", "completion": f"c{i}", "reward": None}
            for i in range(kept)
        ]
        await job.log_samples(batch)
        newest = await job.samples(limit=3)
        assert [s.prompt for s in newest] == [f"p{kept - 1}", f"p{kept - 2}", f"p{kept - 3}"]
        everything = await job.samples(limit=1000)
        assert len(everything) == kept and "1+1=" not in {s.prompt for s in everything}
        # A sampled NUL character (PostgreSQL text cannot hold one) is kept as U+FFFD.
        await job.log_samples([{"step": 2, "prompt": "1\x00+1=", "completion": "2\x00"}])
        [latest] = await job.samples(limit=1)
        assert (latest.prompt, latest.completion) == ("1\ufffd+1=", "2\ufffd")


async def test_progress_names_the_phase_logged_last_and_its_own_step(stack: Stack) -> None:
    async with AsyncLoomClient(stack.url, stack.admin_key) as loom:
        job = await loom.create_job("loom/tiny", name="phases")
        for step in range(1, 1101, 100):
            await job.log_metrics(step, {"sft/loss": 1.0})
        progress = (await loom.get_job(job.id)).info.progress
        assert progress is not None and (progress.phase, progress.step) == ("sft", 1001)
        await asyncio.sleep(0.01)  # updated_at tells which phase came last
        for step in (1, 2):
            await job.log_metrics(step, {"rl/reward": 0.5, "kl/mean": 0.1})
        progress = (await loom.get_job(job.id)).info.progress
        assert progress is not None and (progress.phase, progress.step) == ("rl", 2)
        unphased = await loom.create_job("loom/tiny")
        await unphased.log_metrics(7, {"reward": 1.0})
        progress = (await loom.get_job(unphased.id)).info.progress
        assert progress is not None and (progress.phase, progress.step) == (None, 7)


async def test_a_job_block_ends_the_job_completed_failed_or_cancelled(stack: Stack) -> None:
    async with AsyncLoomClient(stack.url, stack.admin_key) as loom:
        async with await loom.create_job("loom/tiny") as job:
            await job.log_metrics(1, {"sft/loss": 1.0})
        assert (await loom.get_job(job.id)).info.status == "completed"
        with pytest.raises(RuntimeError, match="diverged"):
            async with await loom.create_job("loom/tiny") as job:
                raise RuntimeError("loss diverged")
        assert (await loom.get_job(job.id)).info.status == "failed"
        with pytest.raises(KeyboardInterrupt):
            async with await loom.create_job("loom/tiny") as job:
                raise KeyboardInterrupt
        assert (await loom.get_job(job.id)).info.status == "cancelled"


async def test_job_lifecycle_pause_resume_cancel(stack: Stack) -> None:
    async with AsyncLoomClient(stack.url, stack.admin_key) as loom:
        job = await loom.create_job("loom/tiny")
        assert (await job.set_status("paused")).status == "paused"
        assert (await job.set_status("running")).status == "running"
        assert (await job.set_status("cancelled")).status == "cancelled"
        with pytest.raises(Conflict, match="cancelled; it cannot become running"):
            await job.set_status("running")
        await job.log_metrics(0, {"eval/accuracy": 0.5})  # evaluations may follow the end


async def test_bad_logs_are_4xx_and_write_nothing(stack: Stack) -> None:
    async with stack.client() as admin:
        job = (await admin.post("/v1/jobs", json={"base_model": "loom/tiny"})).json()
        url = f"/v1/jobs/{job['id']}/metrics"
        bad_bodies = [
            {"points": []},
            {"points": [{"step": -1, "name": "reward", "value": 1}]},
            {"points": [{"step": 0, "name": "has space", "value": 1}]},
            {"points": [{"step": 0, "name": "reward", "value": "nan"}]},
            {"points": [{"step": 0, "name": "reward", "value": 1, "extra": True}]},
            {"points": [{"step": 0, "name": "reward", "value": 1}] * 10_001},
        ]
        for body in bad_bodies:
            response = await admin.post(url, json=body)
            assert response.status_code == 422, body
            assert response.json()["error"]["code"] == "invalid_input"
        assert (await admin.get(url)).json()["series"] == []

        too_long = {"samples": [{"step": 0, "prompt": "x" * 40_000, "completion": ""}]}
        response = await admin.post(f"/v1/jobs/{job['id']}/samples", json=too_long)
        assert response.status_code == 422 and "prompt" in response.text
        limit = await admin.get(f"/v1/jobs/{job['id']}/samples", params={"limit": 0})
        assert limit.status_code == 422

        missing = await admin.post(
            "/v1/jobs/job_nope/metrics", json={"points": [{"step": 0, "name": "r", "value": 1}]}
        )
        assert missing.status_code == 404 and "job_nope" in missing.json()["error"]["message"]


async def test_a_value_the_database_cannot_store_is_a_422(stack: Stack) -> None:
    """PostgreSQL text cannot hold a NUL character (SQLite can): a name with one is refused
    with a 422 that says why, and no job is made."""
    async with stack.client() as admin:
        before = (await admin.get("/v1/jobs")).json()
        response = await admin.post("/v1/jobs", json={"base_model": "loom/tiny", "name": "a\x00b"})
        if stack.settings.database_url.startswith("sqlite"):
            assert response.status_code == 201
            return
        assert response.status_code == 422, response.text
        assert "cannot contain NUL" in response.json()["error"]["message"]
        assert (await admin.get("/v1/jobs")).json() == before


async def test_another_keys_job_logs_are_out_of_reach(stack: Stack) -> None:
    async with stack.client() as admin:
        alice = (await admin.post("/v1/keys", json={"name": "alice"})).json()["key"]
        bob = (await admin.post("/v1/keys", json={"name": "bob"})).json()["key"]
    async with (
        AsyncLoomClient(stack.url, alice) as as_alice,
        AsyncLoomClient(stack.url, bob) as as_bob,
    ):
        job = await as_alice.create_job("loom/tiny")
        await job.log_metrics(0, {"reward": 1.0})
        with pytest.raises(NotFound):
            await as_bob.get_job(job.id)
        with pytest.raises(NotFound):
            await as_bob._http.post_json(
                f"/v1/jobs/{job.id}/metrics",
                {"points": [{"step": 1, "name": "reward", "value": 0}]},
            )
        with pytest.raises(NotFound):
            await as_bob._http.get_json(f"/v1/jobs/{job.id}/samples")
        with pytest.raises(ValidationError, match="name"):  # the SDK checks before sending
            await job.log_metrics(0, {"bad name": 1.0})
        assert (await job.metrics())["reward"].values == [1.0]
