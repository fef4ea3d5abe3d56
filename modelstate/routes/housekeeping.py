"""Pins (versions serving engines hold), retention policies and garbage collection."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, status
from starlette.concurrency import run_in_threadpool

from modelstate.deps import CollectorDep, StoreDep
from modelstate.schemas import GcReport, PinList, PinRequest, Retention, RetentionPolicy

HolderPath = Annotated[
    str,
    Path(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,255}$",
        description="Who holds the pins, e.g. rollout@host:port.",
    ),
]
JobPath = Annotated[
    str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]

router = APIRouter(prefix="/v1", tags=["housekeeping"])


@router.put("/pins/{holder}", response_model=PinList)
async def set_pins(store: StoreDep, holder: HolderPath, body: PinRequest) -> PinList:
    """Replace the holder's pins; they lapse after `ttl_s` unless renewed."""
    pins = await run_in_threadpool(store.set_pins, holder, body.versions, body.ttl_s)
    return PinList(pins=pins)


@router.delete("/pins/{holder}", status_code=status.HTTP_204_NO_CONTENT)
async def clear_pins(store: StoreDep, holder: HolderPath) -> None:
    await run_in_threadpool(store.set_pins, holder, [], 1.0)


@router.get("/pins", response_model=PinList)
async def list_pins(store: StoreDep) -> PinList:
    return PinList(pins=await run_in_threadpool(store.pins))


@router.get("/jobs/{job_id}/retention", response_model=Retention)
async def get_retention(collector: CollectorDep, job_id: str) -> Retention:
    return await run_in_threadpool(collector.retention, job_id)


@router.put("/jobs/{job_id}/retention", response_model=Retention)
async def set_retention(
    collector: CollectorDep, job_id: JobPath, body: RetentionPolicy
) -> Retention:
    return await run_in_threadpool(collector.set_retention, job_id, body)


MAX_GRACE_S = 10 * 365 * 24 * 3600


@router.post("/gc", response_model=GcReport)
async def collect_garbage(
    collector: CollectorDep,
    # At most ten years: a longer one would overflow the datetime it is subtracted from.
    grace_s: Annotated[
        float | None, Query(ge=0, le=MAX_GRACE_S, description="Override the grace period.")
    ] = None,
) -> GcReport:
    return await run_in_threadpool(collector.collect, grace_s)
