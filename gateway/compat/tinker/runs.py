"""Tinker's read calls (the SDK's RestClient and the `tinker` CLI) and its checkpoint
housekeeping: server capabilities, training runs (a run is the Loom job made for a training
model, so runs outlive the gateway), one run's checkpoints and every run's, sessions, checkpoint
deletion and TTLs. Training checkpoints are the job's trainer checkpoints (a TTL is their
expiry on the trainer); sampler weights saved by name are rows of the gateway's database."""

from __future__ import annotations

import asyncio

from starlette.concurrency import run_in_threadpool

from gateway.auth.keys import KeyIdentity
from gateway.compat.common.calls import expiry
from gateway.compat.tinker import checkpoints, schemas
from gateway.compat.tinker.service import TinkerService
from services.common.errors import InvalidInput, NotFound
from services.trainer.schemas import CheckpointExpiry


async def capabilities(tinker: TinkerService) -> schemas.ServerCapabilities:
    return schemas.ServerCapabilities(
        supported_models=[
            schemas.SupportedModel(model_name=m.name, trainable=m.served, sampleable=m.served)
            for m in await tinker.served.catalog()
        ]
    )


def page(limit: int, offset: int, total: int) -> schemas.Cursor:
    return schemas.Cursor(offset=offset, limit=limit, total_count=total)


# --- checkpoints ----------------------------------------------------------------------------


async def run_checkpoints(
    tinker: TinkerService, run: checkpoints.TrainingRun
) -> list[schemas.Checkpoint]:
    """A run's training checkpoints and live named sampler weights, oldest first."""
    listed = await tinker.trainer.list_checkpoints(run.job_id)
    found = [checkpoints.training_checkpoint(run.model_id, c) for c in listed.checkpoints]
    prefix = f"{checkpoints.SCHEME}{run.model_id}/"
    for path, ref in (await tinker.state.live_weights(prefix)).items():
        found.append(
            checkpoints.checkpoint(
                checkpoints.parse_path(path), ref.saved_at, expires_at=ref.expires_at
            )
        )
    return sorted(found, key=lambda c: c.time)


async def list_checkpoints(
    tinker: TinkerService, model_id: str, owner: KeyIdentity
) -> schemas.CheckpointsList:
    run = await tinker.training_run(model_id, owner)
    return schemas.CheckpointsList(checkpoints=await run_checkpoints(tinker, run))


async def user_checkpoints(
    tinker: TinkerService, owner: KeyIdentity, limit: int, offset: int
) -> schemas.CheckpointsList:
    """Every checkpoint of every run the key sees, newest first."""
    records = await run_records(tinker, owner)
    per_run = await asyncio.gather(
        *(run_checkpoints(tinker, r.run) for r in records if not r.failed)
    )
    found = sorted((c for listed in per_run for c in listed), key=lambda c: c.time, reverse=True)
    return schemas.CheckpointsList(
        checkpoints=found[offset : offset + limit], cursor=page(limit, offset, len(found))
    )


async def delete_checkpoint(
    tinker: TinkerService, model_id: str, checkpoint_id: str, owner: KeyIdentity
) -> None:
    """A training checkpoint goes from the trainer's disk; sampler weights saved by name are
    forgotten (their version stays in the store, under its retention)."""
    run = await tinker.training_run(model_id, owner)
    path = checkpoints.parse_path(f"{checkpoints.SCHEME}{model_id}/{checkpoint_id}")
    if path.kind == checkpoints.SAMPLER_WEIGHTS:
        if not await tinker.state.forget_weights(str(path)):
            raise NotFound(f"No sampler weights {str(path)!r}.")
        return
    name = checkpoints.checkpoint_name(path.name)
    await tinker.trainer.delete_checkpoint(run.job_id, name)


async def set_ttl(
    tinker: TinkerService,
    model_id: str,
    checkpoint_id: str,
    body: schemas.CheckpointTtl,
    owner: KeyIdentity,
) -> None:
    """`ttl_seconds` from now (None: never expires): a training checkpoint's expiry on the
    trainer; named sampler weights are forgotten when theirs comes."""
    run = await tinker.training_run(model_id, owner)
    path = checkpoints.parse_path(f"{checkpoints.SCHEME}{model_id}/{checkpoint_id}")
    expires_at = expiry(body.ttl_seconds)
    if path.kind == checkpoints.SAMPLER_WEIGHTS:
        if not await tinker.state.expire_weights(str(path), expires_at):
            raise NotFound(f"No sampler weights {str(path)!r}.")
        return
    name = checkpoints.checkpoint_name(path.name)
    await tinker.trainer.set_checkpoint_expiry(
        run.job_id, name, CheckpointExpiry(expires_at=expires_at)
    )


async def weights_info(
    tinker: TinkerService, tinker_path: str, owner: KeyIdentity
) -> schemas.WeightsInfoResponse:
    path = checkpoints.parse_path(tinker_path)
    run = await tinker.training_run(path.model_id, owner)
    if all(c.tinker_path != str(path) for c in await run_checkpoints(tinker, run)):
        raise NotFound(f"No checkpoint {tinker_path!r}.")
    return schemas.WeightsInfoResponse(base_model=run.base_model, lora_rank=run.lora.rank)


# --- training runs --------------------------------------------------------------------------


async def run_records(
    tinker: TinkerService, viewer: KeyIdentity, model_id: str | None = None
) -> list[checkpoints.RunRecord]:
    """The runs `viewer` sees (only `model_id`'s when given), newest first, a run whose job
    failed included."""

    def query() -> list[checkpoints.RunRecord]:
        with tinker.db() as session:
            return checkpoints.run_records(session, viewer, model_id)

    return await run_in_threadpool(query)


async def describe_run(tinker: TinkerService, record: checkpoints.RunRecord) -> schemas.TrainingRun:
    listed = [] if record.failed else await run_checkpoints(tinker, record.run)
    training = [c for c in listed if c.checkpoint_type == "training"]
    sampler = [c for c in listed if c.checkpoint_type == "sampler"]
    latest = max([record.created_at, *(c.time for c in listed)])
    return schemas.TrainingRun(
        training_run_id=record.run.model_id,
        base_model=record.run.base_model,
        model_owner=record.owner_name,
        corrupted=record.failed,
        lora_rank=record.run.lora.rank,
        last_request_time=latest,
        last_checkpoint=training[-1] if training else None,
        last_sampler_checkpoint=sampler[-1] if sampler else None,
    )


async def training_runs(
    tinker: TinkerService, viewer: KeyIdentity, limit: int, offset: int
) -> schemas.TrainingRuns:
    found = await run_records(tinker, viewer)
    shown = await asyncio.gather(*(describe_run(tinker, r) for r in found[offset : offset + limit]))
    return schemas.TrainingRuns(training_runs=list(shown), cursor=page(limit, offset, len(found)))


async def training_run(
    tinker: TinkerService, model_id: str, viewer: KeyIdentity
) -> schemas.TrainingRun:
    found = await run_records(tinker, viewer, model_id)
    if found:
        return await describe_run(tinker, found[0])
    raise NotFound(f"No training run {model_id!r} (or it belongs to another API key).")


# --- sessions -------------------------------------------------------------------------------


async def session_info(
    tinker: TinkerService, session_id: str, owner: KeyIdentity
) -> schemas.SessionInfo:
    await tinker.check_session(session_id, owner)
    prefix = f"{session_id}:"
    return schemas.SessionInfo(
        training_run_ids=[
            r.run.model_id
            for r in reversed(await run_records(tinker, owner))
            if r.run.model_id.startswith(prefix)
        ],
        sampler_ids=await tinker.state.sampler_ids(prefix),
    )


async def sessions(
    tinker: TinkerService, owner: KeyIdentity, limit: int, offset: int
) -> schemas.Sessions:
    """The key's sessions, newest first."""
    mine = await tinker.state.session_ids(owner)
    return schemas.Sessions(sessions=mine[offset : offset + limit])


def check_scope(project_id: str | None) -> None:
    if project_id is not None:
        raise InvalidInput("Loom has no projects: list training runs without project_id.")
