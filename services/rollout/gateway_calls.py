"""What a rollout replica asks of the gateway (the layer above it, reached over HTTP only):
its heartbeat into the routing table, leaving it, and claiming a version's fetch (which peers
to fetch its files from). Internal routes, sent with the service token; built with
`service_token.client_of(settings, GatewayReplicas)`."""

from __future__ import annotations

from services.common.http import Route, ServiceClient
from services.rollout.schemas import FetchClaim, FetchSources, ReplicaHeartbeat, ReplicaPublic


class GatewayReplicas(ServiceClient):
    SERVICE = "gateway"
    HEARTBEAT = Route("PUT", "/v1/internal/replicas/{replica_id}", ReplicaPublic, ReplicaHeartbeat)
    LEAVE: Route[None] = Route("DELETE", "/v1/internal/replicas/{replica_id}", None)
    CLAIM = Route("POST", "/v1/internal/replicas/{replica_id}/fetches", FetchSources, FetchClaim)

    async def heartbeat(
        self, replica_id: str, state: ReplicaHeartbeat, timeout: float
    ) -> ReplicaPublic:
        """Register or refresh the replica (one call); `timeout` in seconds."""
        return await self.call(self.HEARTBEAT, state, timeout=timeout, replica_id=replica_id)

    async def leave(self, replica_id: str, timeout: float) -> None:
        await self.call(self.LEAVE, timeout=timeout, replica_id=replica_id)

    async def claim(self, replica_id: str, job_id: str, number: int) -> FetchSources:
        """The replica is about to fetch version `number` of `job_id`: where from."""
        return await self.call(
            self.CLAIM, FetchClaim(job_id=job_id, number=number), replica_id=replica_id
        )
