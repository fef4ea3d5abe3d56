"""Trainer checkpoints (save_state / load_state): a job resumes on a restarted trainer exactly
where it stopped, optimizer moments included."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from trainer_harness import TrainerHarness, serving

from modelstate.client import ModelStateClient
from services.trainer.settings import TrainerSettings

ADAM = {"adam": {"lr": 1e-2}}
Start = Callable[[], AbstractAsyncContextManager[TrainerHarness]]


@pytest.fixture
def start_trainer(
    tmp_path: Path, tiny_model_dir: Path, modelstate_client: ModelStateClient
) -> Start:
    """Starts a fresh trainer process-equivalent (new app, new memory) on the same disk."""
    settings = TrainerSettings(data_dir=tmp_path / "trainer", trainer_device="cpu")
    return lambda: serving(settings, modelstate_client, tiny_model_dir)


async def steps(
    trainer: TrainerHarness, job: str, data: list[dict[str, Any]], count: int
) -> list[float]:
    losses = []
    for _ in range(count):
        losses.append((await trainer.run(job, "forward_backward", {"data": data}))["loss"])
        await trainer.run(job, "optim_step", ADAM)
    return losses


@pytest.mark.parametrize("mode", ["lora", "full"])
async def test_a_job_resumes_exactly_on_a_restarted_trainer(
    start_trainer: Start, arithmetic_data: list[dict[str, Any]], mode: str
) -> None:
    data = arithmetic_data[:4]
    async with start_trainer() as first:
        await first.create("job_resume", mode)
        await steps(first, "job_resume", data, 3)
        saved = await first.run("job_resume", "save_state", {"name": "step-3"})
        assert saved["step"] == 3 and saved["has_optimizer"] and saved["bytes"] > 0
        expected = await steps(first, "job_resume", data, 2)

    async with start_trainer() as second:
        await second.create("job_resume", mode)
        listed = (await second.http.get("/v1/models/job_resume/checkpoints")).json()
        assert [c["name"] for c in listed["checkpoints"]] == ["step-3"]
        loaded = await second.run("job_resume", "load_state", {"name": "step-3"})
        assert loaded["step"] == 3
        assert (await second.http.get("/v1/models/job_resume")).json()["step"] == 3
        resumed = await steps(second, "job_resume", data, 2)
    assert resumed == pytest.approx(expected, rel=1e-5)


async def test_bad_checkpoint_requests_are_4xx(
    start_trainer: Start, arithmetic_data: list[dict[str, Any]]
) -> None:
    async with start_trainer() as trainer:
        await trainer.create("job_a", "lora")
        await trainer.create("job_b", "lora", lora={"rank": 4})
        before_any_step = await trainer.run("job_a", "save_state", {"name": "fresh"})
        assert before_any_step["has_optimizer"] is False

        again = await trainer.wait(
            (await trainer.submit("job_a", "save_state", {"name": "fresh"}))["id"]
        )
        assert again["status"] == "failed" and again["error"]["code"] == "conflict"
        assert "never reused" in again["error"]["message"]

        unknown = await trainer.http.post("/v1/models/job_a/load_state", json={"name": "nope"})
        assert unknown.status_code == 404 and "nope" in unknown.json()["error"]["message"]
        for body in ({"name": "../escape"}, {"name": ""}, {}, {"name": "x", "more": 1}):
            response = await trainer.http.post("/v1/models/job_a/save_state", json=body)
            assert response.status_code == 422, body
        missing_model = await trainer.http.post("/v1/models/job_x/save_state", json={"name": "a"})
        assert missing_model.status_code == 404

        # A checkpoint of another configuration is refused, and the model is left as it was.
        trainer.service.checkpoint_dir.joinpath("job_b").mkdir(parents=True, exist_ok=True)
        (trainer.service.checkpoint_dir / "job_a" / "fresh").rename(
            trainer.service.checkpoint_dir / "job_b" / "fresh"
        )
        refused = await trainer.wait(
            (await trainer.submit("job_b", "load_state", {"name": "fresh"}))["id"]
        )
        assert refused["status"] == "failed" and refused["error"]["code"] == "invalid_input"
        assert "LoRA" in refused["error"]["message"]
        assert await steps(trainer, "job_b", arithmetic_data[:2], 1)


async def test_a_load_without_the_optimizer_resets_its_moments_and_other_jobs_may_load(
    start_trainer: Start, arithmetic_data: list[dict[str, Any]]
) -> None:
    data = arithmetic_data[:4]
    async with start_trainer() as trainer:
        await trainer.create("job_src", "lora")
        await steps(trainer, "job_src", data, 3)
        assert (await trainer.run("job_src", "save_weights", {}))["number"] == 1
        await trainer.run("job_src", "save_state", {"name": "s"})
        with_moments = await steps(trainer, "job_src", data, 2)

        loaded = await trainer.run("job_src", "load_state", {"name": "s", "optimizer": False})
        assert loaded["step"] == 3
        assert trainer.service.registry.get("job_src").optimizer_state() is None
        fresh = await steps(trainer, "job_src", data, 2)
        # The same weights give the same first loss; fresh moments then take another step.
        assert fresh[0] == pytest.approx(with_moments[0], rel=1e-6)
        assert fresh[1] != pytest.approx(with_moments[1], rel=1e-4)

        # A job of the same configuration loads it too, as the source would have.
        await trainer.create("job_dst", "lora")
        await trainer.run(
            "job_dst", "load_state", {"name": "s", "job_id": "job_src", "optimizer": False}
        )
        info = (await trainer.http.get("/v1/models/job_dst")).json()
        assert info["step"] == 3 and info["last_version"] == 0  # versions are per job
        assert await steps(trainer, "job_dst", data, 2) == pytest.approx(fresh, rel=1e-5)
        await trainer.run("job_dst", "load_state", {"name": "s", "job_id": "job_src"})
        assert await steps(trainer, "job_dst", data, 2) == pytest.approx(with_moments, rel=1e-5)
        await trainer.run("job_src", "load_state", {"name": "s"})
        assert (await trainer.http.get("/v1/models/job_src")).json()["last_version"] == 1

        await trainer.create("job_rank4", "lora", lora={"rank": 4})
        refused = await trainer.wait(
            (await trainer.submit("job_rank4", "load_state", {"name": "s", "job_id": "job_src"}))[
                "id"
            ]
        )
        assert refused["status"] == "failed" and "of job job_src" in refused["error"]["message"]
        unknown = await trainer.http.post(
            "/v1/models/job_dst/load_state", json={"name": "s", "job_id": "job_nope"}
        )
        assert unknown.status_code == 404 and "job_nope" in unknown.json()["error"]["message"]


async def test_a_series_keeps_its_newest_checkpoints_over_http(start_trainer: Start) -> None:
    async with start_trainer() as trainer:
        await trainer.create("job_series", "lora")
        await trainer.run("job_series", "save_state", {"name": "mine"})
        for step in range(1, 5):
            await trainer.run(
                "job_series", "save_state", {"name": f"run-step-{step}", "series": "run"}
            )
        listed = (await trainer.http.get("/v1/models/job_series/checkpoints")).json()
        assert [c["name"] for c in listed["checkpoints"]] == ["mine", "run-step-3", "run-step-4"]
        deleted = await trainer.http.delete("/v1/models/job_series/checkpoints/mine")
        assert deleted.status_code == 200 and deleted.json()["name"] == "mine"
        gone = await trainer.http.delete("/v1/models/job_series/checkpoints/mine")
        assert gone.status_code == 404
        bad = await trainer.http.delete("/v1/models/job_series/checkpoints/..x")
        assert bad.status_code == 422


async def test_reset_optimizer_starts_a_phase_without_the_last_ones_moments(
    start_trainer: Start, arithmetic_data: list[dict[str, Any]]
) -> None:
    """After a reset, a step moves the weights as a first step of a fresh AdamW would: the
    same as a model that never trained from the same weights (its moments empty)."""
    data = arithmetic_data[:4]
    async with start_trainer() as trainer:
        for job in ("job_phases", "job_fresh"):
            await trainer.create(job, "lora")
        await steps(trainer, "job_phases", data, 3)
        await trainer.run("job_phases", "save_state", {"name": "after-sft"})
        await trainer.run(
            "job_fresh",
            "load_state",
            {"name": "after-sft", "job_id": "job_phases", "optimizer": False},
        )
        await trainer.run("job_phases", "forward_backward", {"data": data})
        info = await trainer.run("job_phases", "reset_optimizer", {})
        assert info["step"] == 3
        # the pending gradients went with the moments: an optim_step now has none to apply
        refused = await trainer.submit("job_phases", "optim_step", ADAM)
        assert (await trainer.wait(refused["id"]))["status"] == "failed"
        phases = await steps(trainer, "job_phases", data, 2)
        fresh = await steps(trainer, "job_fresh", data, 2)
        assert phases == pytest.approx(fresh, rel=1e-5)
