"""Rollout replicas: the routing table (admins), the heartbeat replicas send (service token)
and rollout's readiness as a whole (open). Routes parse, call, return; the registry is
`gateway.proxy.replicas`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response
from fastapi.responses import JSONResponse

from gateway.auth.deps import AdminKey, ServiceCaller
from gateway.deps import ReplicasDep, UpstreamsDep
from services.common.errors import NotFound
from services.common.schemas import Health
from services.rollout.schemas import ReplicaHeartbeat, ReplicaList, ReplicaPublic

router = APIRouter(prefix="/v1", tags=["replicas"])
ReplicaId = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")]


@router.get("/rollout/replicas", response_model=ReplicaList)
async def list_replicas(_admin: AdminKey, replicas: ReplicasDep) -> ReplicaList:
    return ReplicaList(replicas=replicas.public())


@router.get("/internal/replicas", response_model=ReplicaList)
async def peer_table(_caller: ServiceCaller, replicas: ReplicasDep) -> ReplicaList:
    """The routing table for the replicas themselves: a replica fetches a version's files from
    one that already holds it (`services.rollout.fanout`)."""
    return ReplicaList(replicas=replicas.public())


@router.put("/internal/replicas/{replica_id}", response_model=ReplicaPublic)
async def heartbeat(
    replica_id: ReplicaId, body: ReplicaHeartbeat, _caller: ServiceCaller, replicas: ReplicasDep
) -> ReplicaPublic:
    """A replica's registration and heartbeat, one call."""
    return replicas.heartbeat(replica_id, body).public(replicas.clock())


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
