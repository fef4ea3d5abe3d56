"""WeaverService against a recording trainer stand-in and a real gateway database: models are
jobs found again after a gateway restart, resent calls run once, and one key cannot reach
another's models."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gateway.auth.keys import KeyIdentity
from gateway.compat.common.state import SamplerRef
from gateway.compat.weaver import listing, operations, schemas
from gateway.compat.weaver.service import WeaverService
from gateway.jobs import logs as job_logs
from services.common.errors import Conflict, InvalidInput, NotFound
from tests.support.trainer import FakeTrainer, adapter_parts


@dataclass
class Stand:
    weaver: WeaverService
    trainer: FakeTrainer
    owner: KeyIdentity
    other: KeyIdentity
    restart: Callable[[], WeaverService]  # a new gateway's service on the same database


@pytest.fixture
async def stand(tmp_path: Path) -> AsyncIterator[Stand]:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    async with adapter_parts(tmp_path) as parts:
        parts.trainer.rollout_base = str(model_dir)  # rollout serves Acme/Model

        def service() -> WeaverService:
            return WeaverService(
                parts.sessions,
                parts.client,
                parts.rollout,
                {"Acme/Model": str(model_dir)},
                tmp_path,
            )

        yield Stand(service(), parts.trainer, parts.owner, parts.other, service)


def optim(model_id: str, seq_id: int) -> schemas.OptimBody:
    return schemas.OptimBody.model_validate({"payload": {"model_id": model_id, "seq_id": seq_id}})


async def test_a_model_is_a_job_made_once_and_found_again_after_a_restart(stand: Stand) -> None:
    weaver, owner = stand.weaver, stand.owner
    session = (await weaver.create_session(schemas.CreateSession(name="exp"), owner)).id
    spec = schemas.CreateModel(
        model_seq_id=1,
        base_model="Acme/Model:32768",
        lora_config=schemas.LoraSpec(rank=4, train_mlp=False),
    )
    made = await weaver.create_model(session, spec, owner)
    assert await weaver.create_model(session, spec, owner) == made  # resent: one model
    (created,) = stand.trainer.created
    assert created.job_id == made.id and created.base_model.endswith("/model")
    assert created.lora.rank == 4 and created.lora.target_modules == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
    ]
    assert made.base_model == "Acme/Model:32768" and made.tokenizer_path.endswith("model")
    first = await weaver.optim_step(made.id, optim(made.id, 1), owner)
    assert await weaver.optim_step(made.id, optim(made.id, 1), owner) == first

    # A new gateway: the model is found by its job and the SDK's numbering goes on from 2.
    restarted = stand.restart()
    found = await restarted.model(made.id, owner)
    assert found.public().training_mode == "lora" and found.base_model == "Acme/Model:32768"
    await restarted.optim_step(made.id, optim(made.id, 2), owner)
    assert [action for _, action, _ in stand.trainer.calls] == ["optim_step", "optim_step"]
    with pytest.raises(NotFound, match="another API key"):
        await restarted.model(made.id, stand.other)
    # Sessions are rows of the gateway's database: the new gateway serves them too.
    assert (await restarted.session(session, owner)).models == {1: made.id}
    assert await restarted.create_model(session, spec, owner) == made  # resent: still one

    await restarted.terminate(made.id, owner)
    with pytest.raises(Conflict, match="terminated"):
        await restarted.optim_step(made.id, optim(made.id, 3), owner)
    found_again = await stand.restart().model(made.id, owner)
    assert found_again.terminated  # the job is completed


async def test_metrics_land_on_the_models_job_and_foreign_ones_are_refused(stand: Stand) -> None:
    weaver, owner = stand.weaver, stand.owner
    session = (await weaver.create_session(schemas.CreateSession(), owner)).id
    model = (
        await weaver.create_model(
            session, schemas.CreateModel(model_seq_id=1, base_model="Acme/Model"), owner
        )
    ).id
    logged = schemas.LogMetrics.model_validate(
        {
            "metrics": [
                {"model_id": model, "name": "reward", "value": 0.5, "step": 3},
                {"model_id": model, "name": "reward", "value": 0.75, "step": 4},
            ]
        }
    )
    assert (await weaver.log_metrics(session, logged, owner)).accepted == 2
    with weaver.db() as db:
        (series,) = job_logs.metric_series(db, model, ["reward"], None)
    assert (series.steps, series.values) == ([3, 4], [0.5, 0.75])
    other_session = (await weaver.create_session(schemas.CreateSession(), stand.other)).id
    with pytest.raises(NotFound):
        await weaver.log_metrics(other_session, logged, stand.other)
    bad = schemas.LogMetrics.model_validate(
        {"metrics": [{"model_id": model, "name": "bad name!", "value": 1.0, "step": 0}]}
    )
    with pytest.raises(InvalidInput, match="metrics"):
        await weaver.log_metrics(session, bad, owner)


async def test_checkpoints_and_samplers_check_their_paths_and_owners(stand: Stand) -> None:
    weaver, owner, other = stand.weaver, stand.owner, stand.other
    session = (await weaver.create_session(schemas.CreateSession(), owner)).id
    model = (
        await weaver.create_model(
            session, schemas.CreateModel(model_seq_id=1, base_model="Acme/Model"), owner
        )
    ).id
    other_session = (await weaver.create_session(schemas.CreateSession(), other)).id
    theirs = (
        await weaver.create_model(
            other_session, schemas.CreateModel(model_seq_id=1, base_model="Acme/Model"), other
        )
    ).id
    load = schemas.LoadCheckpoint(path=f"weaver://{theirs}/checkpoints/step-1")
    with pytest.raises(NotFound):
        await weaver.load_checkpoint(model, load, owner)
    with pytest.raises(InvalidInput, match="save_weights_for_sampler"):
        await weaver.save_checkpoint(model, schemas.SaveCheckpoint(type="sampling"), owner)
    with pytest.raises(InvalidInput, match="reserved"):
        await weaver.export_sampler(model, schemas.ExportSampler(seq_id=1, path="v3"), owner)
    unnamed = schemas.CreateSamplingSession(
        sampling_session_seq_id=1, model_path=f"weaver://{model}/sampler_weights/v2"
    )
    bound = await weaver.create_sampling_session(session, unnamed, owner)
    assert (bound.model_id, bound.weight_version) == (model, 2)
    named = schemas.CreateSamplingSession(
        sampling_session_seq_id=2, model_path=f"weaver://{model}/sampler_weights/best"
    )
    with pytest.raises(NotFound, match="No sampler weights"):
        await weaver.create_sampling_session(session, named, owner)
    with pytest.raises(NotFound):
        await weaver.create_sampling_session(other_session, unnamed, other)

    # TTLs: a checkpoint's is its expiry on the trainer; named sampler weights are forgotten
    op = await weaver.save_checkpoint(
        model, schemas.SaveCheckpoint(name="c", ttl_seconds=60), owner
    )
    assert (await operations.poll(weaver.futures, op)).status == "done"
    (listed,) = (await weaver.list_checkpoints(model, owner)).items
    assert listed.expires_at is not None and listed.ttl_seconds > 0
    await weaver.state.add_weights(
        named.model_path,
        SamplerRef(
            owner.id, "Acme/Model", model, 3, expires_at=datetime.now(UTC) - timedelta(seconds=1)
        ),
    )
    with pytest.raises(NotFound, match="No sampler weights"):
        await weaver.create_sampling_session(session, named, owner)


async def test_models_and_runs_are_listed_from_their_jobs_and_unserved_bases_refused(
    stand: Stand,
) -> None:
    weaver, owner = stand.weaver, stand.owner
    session = (await weaver.create_session(schemas.CreateSession(name="exp"), owner)).id
    made = [
        (
            await weaver.create_model(
                session,
                schemas.CreateModel(model_seq_id=i, base_model="Acme/Model", training_mode=mode),
                owner,
            )
        ).id
        for i, mode in enumerate(["lora", "full_ft"])
    ]
    page = await listing.model_page(weaver, owner, limit=1, offset=1)
    (first,) = page.items
    assert first.id == made[0] and page.pagination.total_count == 2  # newest first
    assert (
        first.session_id,
        first.model_seq_id,
        first.base_model,
        first.training_mode,
        first.lora_config,
    ) == (session, 0, "Acme/Model", "lora", schemas.LoraSummary(rank=32))
    assert (await listing.model_page(weaver, stand.other, 25, 0)).items == []
    run = await listing.training_run(weaver, made[1], owner)
    assert run.training_mode == "full_ft" and run.lora_config is None and run.checkpoints == []
    with pytest.raises(NotFound, match="another API key"):
        await listing.training_run(weaver, made[1], stand.other)

    catalog = {m.name: m for m in (await listing.catalog(weaver, 100, 0)).items}
    assert catalog.keys() == {"Acme/Model", stand.trainer.rollout_base}  # both spellings
    served = catalog["Acme/Model"]
    assert (served.status, served.training_modes) == ("available", ["lora", "full_ft"])
    assert len(served.prices) == 8 and served.prices["training_tokens:lora"].unit_price_micros == 0
    with pytest.raises(InvalidInput, match=r"'Other/Model'.*serves \[.*'Acme/Model'\]"):
        await weaver.create_model(
            session, schemas.CreateModel(model_seq_id=5, base_model="Other/Model"), owner
        )
    with pytest.raises(InvalidInput, match="sampling client"):
        await weaver.create_sampling_session(
            session,
            schemas.CreateSamplingSession(sampling_session_seq_id=0, base_model="Other/Model"),
            owner,
        )
