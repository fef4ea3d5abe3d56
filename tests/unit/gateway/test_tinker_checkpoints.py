"""Tinker's save_state / load_state / checkpoint calls mapped onto the trainer's checkpoint
operations: paths, ordering, create-from-state, listing, TTLs; its read calls (runs, sessions,
capabilities) and base-model checks. The trainer is a stand-in that
records what reached it; the gateway's database is SQLite in a temporary directory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.auth.keys import KeyIdentity
from gateway.compat.tinker import runs, schemas
from gateway.compat.tinker.checkpoints import checkpoint_name, parse_path, training_path
from gateway.compat.tinker.futures import PENDING, retrieve
from gateway.compat.tinker.service import TinkerService, TrainingModel
from services.common.errors import InvalidInput, NotFound
from tests.support.trainer import FakeTrainer, adapter_parts


@dataclass
class Stand:
    tinker: TinkerService
    trainer: FakeTrainer
    owner: KeyIdentity
    other: KeyIdentity
    restart: Callable[[], TinkerService]  # a new gateway's service on the same database


@pytest.fixture
async def stand(tmp_path: Path) -> AsyncIterator[Stand]:
    async with adapter_parts(tmp_path) as parts:

        def service() -> TinkerService:
            return TinkerService(parts.sessions, parts.client, parts.rollout, {}, tmp_path)

        yield Stand(service(), parts.trainer, parts.owner, parts.other, service)


async def result(tinker: TinkerService, submitted: schemas.Future) -> Any:
    answer = await retrieve(tinker.futures, submitted.request_id, 60)  # builds a tiny model
    assert answer is not PENDING
    return answer


async def new_model(tinker: TinkerService, owner: KeyIdentity) -> str:
    session = await tinker.create_session(owner)
    created = await tinker.create_model(
        schemas.CreateModel(
            session_id=session,
            model_seq_id=0,
            base_model="loom/tiny",
            lora_config=schemas.LoraSpec(rank=4),
        ),
        owner,
    )
    assert (await result(tinker, created))["model_id"] == created.model_id
    model_id: str = created.model_id
    return model_id


def test_paths_name_a_model_a_kind_and_a_checkpoint() -> None:
    path = parse_path("tinker://loom-1:train:0/weights/step-3")
    assert (path.model_id, path.kind, path.name) == ("loom-1:train:0", "weights", "step-3")
    assert str(path) == "tinker://loom-1:train:0/weights/step-3"
    assert path.checkpoint_id == "weights/step-3"
    assert parse_path("tinker://m/sampler_weights/s").kind == "sampler_weights"
    for bad in (
        "m/weights/a",
        "tinker://m/weights",
        "tinker://m/other/a",
        "tinker:///weights/a",
        "tinker://m/weights/a/b",
    ):
        with pytest.raises(InvalidInput, match="not a Tinker checkpoint path"):
            parse_path(bad)
    with pytest.raises(InvalidInput, match="sampler weights"):
        training_path("tinker://m/sampler_weights/s")
    with pytest.raises(InvalidInput, match="letters, digits"):
        checkpoint_name("../up")
    with pytest.raises(InvalidInput, match="needs a name"):
        checkpoint_name(None)


async def test_save_and_load_reach_the_trainer_in_seq_order(stand: Stand) -> None:
    tinker, fake, owner = stand.tinker, stand.trainer, stand.owner
    model_id = await new_model(tinker, owner)
    job = tinker.models[model_id].job_id
    path = f"tinker://{model_id}/weights/first"
    load = asyncio.ensure_future(
        tinker.load_state(
            schemas.LoadState(model_id=model_id, seq_id=2, path=path, optimizer=False), owner
        )
    )
    await asyncio.sleep(0.05)
    assert not fake.calls  # seq_id 2 waits for seq_id 1
    saved = await tinker.save_state(
        schemas.SaveState(model_id=model_id, seq_id=1, path="first"), owner
    )
    loaded = await load
    assert await result(tinker, saved) == {"path": path, "type": "save_weights"}
    assert await result(tinker, loaded) == {
        "path": path,
        "model_id": model_id,
        "type": "load_weights",
    }
    assert fake.calls == [
        (job, "save_state", {"name": "first", "series": None, "expires_at": None}),
        (job, "load_state", {"name": "first", "job_id": None, "optimizer": False}),
    ]
    # A resent seq_id (the SDK's retry) is the same request, not a second save.
    again = await tinker.save_state(
        schemas.SaveState(model_id=model_id, seq_id=1, path="first"), owner
    )
    assert again == saved and len(fake.calls) == 2

    # Names are never reused: the SDK gets a failed future that says so.
    reused = await tinker.save_state(
        schemas.SaveState(model_id=model_id, seq_id=3, path="first", overwrite=True), owner
    )
    failed = await result(tinker, reused)
    assert failed["category"] == "user" and "overwrite=True is not served" in failed["error"]


async def test_bad_paths_and_names_fail_without_holding_up_later_calls(stand: Stand) -> None:
    tinker, fake, owner = stand.tinker, stand.trainer, stand.owner
    model_id = await new_model(tinker, owner)
    with pytest.raises(InvalidInput, match="letters, digits"):
        await tinker.save_state(schemas.SaveState(model_id=model_id, seq_id=1, path="a b"), owner)
    with pytest.raises(InvalidInput, match="sampler weights"):
        await tinker.load_state(
            schemas.LoadState(
                model_id=model_id,
                seq_id=2,
                path=f"tinker://{model_id}/sampler_weights/x",
                optimizer=True,
            ),
            owner,
        )
    with pytest.raises(NotFound, match="nope:train:0"):
        await tinker.load_state(
            schemas.LoadState(
                model_id=model_id, seq_id=3, path="tinker://nope:train:0/weights/x", optimizer=True
            ),
            owner,
        )
    with pytest.raises(InvalidInput, match="model_id and a seq_id"):
        await tinker.load_state(
            schemas.LoadState(path="tinker://m/weights/x", optimizer=True), owner
        )
    saved = await tinker.save_state(
        schemas.SaveState(model_id=model_id, seq_id=4, path="ok"), owner
    )
    assert (await result(tinker, saved))["path"].endswith("/weights/ok")
    assert [action for _, action, _ in fake.calls] == ["save_state"]


async def test_create_from_state_makes_a_job_like_the_source_and_loads_its_checkpoint(
    stand: Stand,
) -> None:
    tinker, fake, owner = stand.tinker, stand.trainer, stand.owner
    source = await new_model(tinker, owner)
    source_job = tinker.models[source].job_id
    await result(
        tinker,
        await tinker.save_state(schemas.SaveState(model_id=source, seq_id=1, path="ckpt"), owner),
    )
    session = await tinker.create_session(owner)
    submitted = await tinker.load_state(
        schemas.LoadState(
            session_id=session,
            model_seq_id=0,
            path=f"tinker://{source}/weights/ckpt",
            optimizer=True,
        ),
        owner,
    )
    model_id = f"{session}:train:0"
    assert submitted.model_id == model_id
    assert (await result(tinker, submitted))["model_id"] == model_id
    model: TrainingModel = tinker.models[model_id]
    assert model.job_id != source_job and model.lora_rank == 4
    assert fake.created[-1].lora == fake.created[0].lora
    assert fake.calls[-1] == (
        model.job_id,
        "load_state",
        {"name": "ckpt", "job_id": source_job, "optimizer": True},
    )
    assert (await tinker.get_info(model_id, owner)).lora_rank == 4

    # A checkpoint of another base model is refused, as a failed future.
    refused = await tinker.load_state(
        schemas.LoadState(
            session_id=session,
            model_seq_id=1,
            path=f"tinker://{source}/weights/ckpt",
            optimizer=False,
            base_model="other/model",
        ),
        owner,
    )
    assert "was trained on 'loom/tiny'" in (await result(tinker, refused))["error"]


async def test_checkpoints_are_listed_and_found_again_after_a_gateway_restart(stand: Stand) -> None:
    tinker, owner = stand.tinker, stand.owner
    model_id = await new_model(tinker, owner)
    await result(
        tinker,
        await tinker.save_state(schemas.SaveState(model_id=model_id, seq_id=1, path="s1"), owner),
    )
    await result(
        tinker,
        await tinker.save_for_sampler(
            schemas.SaveForSampler(model_id=model_id, seq_id=2, path="w1"), owner
        ),
    )
    listed = await runs.list_checkpoints(tinker, model_id, owner)
    assert [(c.checkpoint_id, c.checkpoint_type, c.tinker_path) for c in listed.checkpoints] == [
        ("weights/s1", "training", f"tinker://{model_id}/weights/s1"),
        ("sampler_weights/w1", "sampler", f"tinker://{model_id}/sampler_weights/w1"),
    ]
    assert listed.checkpoints[0].size_bytes == 10 and listed.cursor is None
    info = await runs.weights_info(tinker, f"tinker://{model_id}/weights/s1", owner)
    assert info == schemas.WeightsInfoResponse(base_model="loom/tiny", lora_rank=4)
    with pytest.raises(NotFound):
        await runs.weights_info(tinker, f"tinker://{model_id}/weights/nope", owner)

    restarted = stand.restart()  # memory gone: the run is found by its job, the named
    again = await runs.list_checkpoints(restarted, model_id, owner)  # weights by their row
    assert [c.checkpoint_id for c in again.checkpoints] == ["weights/s1", "sampler_weights/w1"]
    run = await restarted.training_run(model_id, owner)
    assert run.job_id == tinker.models[model_id].job_id and run.lora.rank == 4
    with pytest.raises(NotFound):
        await runs.list_checkpoints(restarted, model_id, stand.other)


async def test_ttls_reach_the_trainer_as_expiries_and_named_sampler_weights_expire(
    stand: Stand,
) -> None:
    tinker, fake, owner = stand.tinker, stand.trainer, stand.owner
    model_id = await new_model(tinker, owner)
    job = tinker.models[model_id].job_id
    before = datetime.now(UTC)
    await result(
        tinker,
        await tinker.save_state(
            schemas.SaveState(model_id=model_id, seq_id=1, path="s1", ttl_seconds=7200), owner
        ),
    )
    expires_at = datetime.fromisoformat(fake.calls[-1][2]["expires_at"])
    assert before + timedelta(hours=2) <= expires_at <= datetime.now(UTC) + timedelta(hours=2)
    (listed,) = (await runs.list_checkpoints(tinker, model_id, owner)).checkpoints
    assert listed.expires_at == expires_at
    await runs.set_ttl(tinker, model_id, "weights/s1", schemas.CheckpointTtl(), owner)
    assert fake.calls[-1] == (job, "expiry", {"expires_at": None})

    await result(
        tinker,
        await tinker.save_for_sampler(
            schemas.SaveForSampler(model_id=model_id, seq_id=2, path="w1", ttl_seconds=3600), owner
        ),
    )
    path = f"tinker://{model_id}/sampler_weights/w1"
    saved = await tinker.state.weights(path)
    assert saved is not None and saved.expires_at is not None
    await runs.set_ttl(
        tinker, model_id, "sampler_weights/w1", schemas.CheckpointTtl(ttl_seconds=1), owner
    )
    assert await tinker.state.expire_weights(path, before)  # its time came
    assert [
        c.checkpoint_id for c in (await runs.list_checkpoints(tinker, model_id, owner)).checkpoints
    ] == ["weights/s1"]
    session = await tinker.create_session(owner)
    with pytest.raises(NotFound, match="No sampler weights"):
        await tinker.create_sampling_session(
            schemas.CreateSamplingSession(
                session_id=session, sampling_session_seq_id=0, model_path=path
            ),
            owner,
        )
    with pytest.raises(ValidationError):
        schemas.CheckpointTtl(ttl_seconds=0)


async def test_runs_sessions_and_every_checkpoint_of_a_key_are_listed(stand: Stand) -> None:
    tinker, owner = stand.tinker, stand.owner
    first = await new_model(tinker, owner)
    second = await new_model(tinker, owner)
    await result(
        tinker,
        await tinker.save_state(schemas.SaveState(model_id=first, seq_id=1, path="a"), owner),
    )
    await result(
        tinker,
        await tinker.save_for_sampler(
            schemas.SaveForSampler(model_id=first, seq_id=2, path="b"), owner
        ),
    )
    listed = await runs.training_runs(tinker, owner, limit=1, offset=0)
    assert [r.training_run_id for r in listed.training_runs] == [second]  # newest first
    assert (listed.cursor.total_count, listed.cursor.limit) == (2, 1)
    run = await runs.training_run(tinker, first, owner)
    assert (run.base_model, run.lora_rank, run.model_owner, run.corrupted) == (
        "loom/tiny",
        4,
        "owner",
        False,
    )
    assert run.last_checkpoint is not None and run.last_checkpoint.checkpoint_id == "weights/a"
    assert run.last_sampler_checkpoint is not None
    assert run.last_sampler_checkpoint.tinker_path == f"tinker://{first}/sampler_weights/b"
    with pytest.raises(NotFound, match="another API key"):
        await runs.training_run(tinker, first, stand.other)
    assert (await runs.training_runs(tinker, stand.other, 20, 0)).training_runs == []

    every = await runs.user_checkpoints(tinker, owner, limit=100, offset=0)
    assert {c.tinker_path for c in every.checkpoints} == {
        f"tinker://{first}/weights/a",
        f"tinker://{first}/sampler_weights/b",
    }
    assert every.cursor is not None and every.cursor.total_count == 2

    session = first.split(":")[0]
    info = await runs.session_info(tinker, session, owner)
    assert info.training_run_ids == [first] and info.sampler_ids == []
    assert (await runs.sessions(tinker, owner, 20, 0)).sessions[-1] == session
    assert (await runs.sessions(tinker, stand.other, 20, 0)).sessions == []
    caps = await runs.capabilities(tinker)
    assert [(m.model_name, m.trainable, m.sampleable) for m in caps.supported_models] == [
        ("loom/tiny", True, True)
    ]


async def test_a_base_model_rollout_does_not_serve_is_refused_naming_the_served_ones(
    stand: Stand,
) -> None:
    tinker, owner = stand.tinker, stand.owner
    session = await tinker.create_session(owner)
    with pytest.raises(InvalidInput, match=r"'Qwen/Qwen3-8B'.*serves \['loom/tiny'\]"):
        await tinker.create_model(
            schemas.CreateModel(session_id=session, model_seq_id=0, base_model="Qwen/Qwen3-8B"),
            owner,
        )
    with pytest.raises(InvalidInput, match=r"sampling client.*'other/model'"):
        await tinker.create_sampling_session(
            schemas.CreateSamplingSession(
                session_id=session, sampling_session_seq_id=0, base_model="other/model"
            ),
            owner,
        )
    assert not stand.trainer.created
