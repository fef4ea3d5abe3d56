"""Weaver's listing calls: the supported models (names, and the detailed catalog with each
mode's prices, all zero on a self-hosted Loom), and the training models a key made with the
SDK (`list_models`, `list_training_runs`, `get_training_run`), found from their Loom jobs so
they outlive the gateway's memory."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from gateway.auth.keys import KeyIdentity
from gateway.compat.weaver import schemas
from gateway.compat.weaver.service import MODES, WeaverService
from gateway.jobs.jobs import visible_to
from gateway.models import JobRow
from services.common.errors import NotFound

JOB_PREFIX = "weaver "  # every Weaver model's job name starts so
USAGE_KINDS = (
    "training_tokens",
    "sampling_prefill_tokens",
    "sampling_cached_prefill_tokens",
    "sampling_output_tokens",
)


async def catalog(weaver: WeaverService, limit: int, offset: int) -> schemas.Catalog:
    """Served models are `available` in both modes; names mapped onto another base are
    listed `unavailable` (the SDK leaves them out)."""
    found = await weaver.served.catalog()
    items = [
        schemas.CatalogModel(
            id=m.name,
            name=m.name,
            status="available" if m.served else "unavailable",
            training_modes=list(MODES),
            prices={f"{kind}:{mode}": schemas.Price() for kind in USAGE_KINDS for mode in MODES},
            config={"resource": {"tokenizer": {"path": None}}},
            metadata={"loom_base_model": m.loom_name},
        )
        for m in found
    ]
    return schemas.Catalog(
        items=items[offset : offset + limit],
        pagination=schemas.Pagination(total_count=len(items), limit=limit, offset=offset),
    )


def summary(row: JobRow) -> schemas.ModelSummary | None:
    """A Weaver model's summary from its job (None: the job is not a Weaver model)."""
    config = row.config
    name = config.get("weaver_base_model")
    if not isinstance(name, str):
        return None
    lora = row.lora if row.mode == "lora" else None
    return schemas.ModelSummary(
        id=row.id,
        session_id=config.get("weaver_session"),
        model_seq_id=config.get("weaver_model_seq_id"),
        base_model=name,
        training_mode="lora" if row.mode == "lora" else "full_ft",
        lora_config=None if lora is None else schemas.LoraSummary(rank=lora["rank"]),
        status=row.status,
        created_at=row.created_at,
        last_request_at=row.created_at,
    )


def summaries(
    session: Session, viewer: KeyIdentity, model_id: str | None
) -> list[schemas.ModelSummary]:
    query = select(JobRow).where(JobRow.name.like(f"{JOB_PREFIX}%"), visible_to(viewer))
    if model_id is not None:
        query = query.where(JobRow.id == model_id)
    found = (summary(row) for row in session.scalars(query.order_by(JobRow.created_at.desc())))
    return [s for s in found if s is not None]


async def model_page(
    weaver: WeaverService, viewer: KeyIdentity, limit: int, offset: int
) -> schemas.ModelPage:
    """The key's Weaver models, newest first (`list_models` and `list_training_runs`)."""

    def query() -> list[schemas.ModelSummary]:
        with weaver.db() as session:
            return summaries(session, viewer, None)

    found = await run_in_threadpool(query)
    return schemas.ModelPage(
        items=found[offset : offset + limit],
        pagination=schemas.Pagination(total_count=len(found), limit=limit, offset=offset),
    )


async def training_run(
    weaver: WeaverService, model_id: str, viewer: KeyIdentity
) -> schemas.TrainingRunDetail:
    def query() -> list[schemas.ModelSummary]:
        with weaver.db() as session:
            return summaries(session, viewer, model_id)

    found = await run_in_threadpool(query)
    if not found:
        raise NotFound(f"No training run {model_id!r} (or it belongs to another API key).")
    checkpoints = (await weaver.list_checkpoints(model_id, viewer)).items
    times = [found[0].created_at, *(datetime.fromisoformat(c.created_at) for c in checkpoints)]
    return schemas.TrainingRunDetail(
        **{**found[0].model_dump(), "last_request_at": max(times)}, checkpoints=checkpoints
    )
