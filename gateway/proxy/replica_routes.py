"""Rollout replicas: the routing table (admins), the heartbeat replicas send and the fetches
they claim (service token), and rollout's readiness as a whole (open). Routes parse, call,
return; the registry is `gateway.proxy.replicas`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response
from fastapi.responses import JSONResponse

from gateway.auth.deps import AdminKey, ServiceCaller
from gateway.deps import ReplicasDep, UpstreamsDep
from services.common.errors import NotFound
from services.common.schemas import Health
from services.rollout.schemas import (
    FetchClaim,
    FetchSources,
    ReplicaHeartbeat,
    ReplicaList,
    ReplicaPublic,
)

router = APIRouter(prefix="/v1", tags=["replicas"])
ReplicaId = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")]


@router.get("/rollout/replicas", response_model=ReplicaList)
async def list_replicas(_admin: AdminKey, replicas: ReplicasDep) -> ReplicaList:
    return ReplicaList(replicas=replicas.public())


@router.put("/internal/replicas/{replica_id}", response_model=ReplicaPublic)
async def heartbeat(
    replica_id: ReplicaId, body: ReplicaHeartbeat, _caller: ServiceCaller, replicas: ReplicasDep
) -> ReplicaPublic:
    """A replica's registration and heartbeat, one call."""
    return replicas.heartbeat(replica_id, body).public(replicas.clock())


@router.post("/internal/replicas/{replica_id}/fetches", response_model=FetchSources)
async def claim_fetch(
    replica_id: ReplicaId, body: FetchClaim, _caller: ServiceCaller, replicas: ReplicasDep
) -> FetchSources:
    """A replica about to fetch a version's files: the replicas to fetch them from, best first
    (`services.rollout.fanout`); the store is the last source."""
    sources = replicas.claim(replica_id, (body.job_id, body.number))
    if sources is None:
        raise NotFound(
            f"No rollout replica {replica_id!r} is registered: it claims a fetch after its "
            "first heartbeat.",
            {"replica_id": replica_id},
        )
    return FetchSources(sources=sources)


@router.delete("/internal/replicas/{replica_id}", status_code=204)
async def leave(replica_id: ReplicaId, _caller: ServiceCaller, replicas: ReplicasDep) -> Response:
    """A replica going away on purpose: no new request is routed to it."""
    if not replicas.leave(replica_id):
        raise NotFound(
            f"No rollout replica {replica_id!r} is registered.", {"replica_id": replica_id}
        )
    return Response(status_code=204)


@router.get("/internal/rollout/readyz", response_model=Health)
async def rollout_readiness(upstreams: UpstreamsDep) -> JSONResponse:
    """Rollout's readiness as a whole, open like every `/readyz` (no secret in it): ready while
    a registered replica is. Where replicas come and go (a Ray cluster), a process that waits
    for rollout (the worker) points LOOM_ROLLOUT_URL at `<gateway>/v1/internal/rollout`."""
    health = await upstreams.probe("rollout")
    ready = health.status in ("ready", "ok")
    return JSONResponse(health.model_dump(mode="json"), status_code=200 if ready else 503)
