"""What a rollout replica asks of the gateway (the layer above it, reached over HTTP only):
its heartbeat into the routing table, leaving it, and the table itself (which peers hold a
version). Internal routes, sent with the service token; built with
`service_token.client_of(settings, GatewayReplicas)`."""

from __future__ import annotations

from services.common.http import Route, ServiceClient
from services.rollout.schemas import ReplicaHeartbeat, ReplicaList, ReplicaPublic


class GatewayReplicas(ServiceClient):
    SERVICE = "gateway"
    TABLE = Route("GET", "/v1/internal/replicas", ReplicaList)
    HEARTBEAT = Route("PUT", "/v1/internal/replicas/{replica_id}", ReplicaPublic, ReplicaHeartbeat)
    LEAVE: Route[None] = Route("DELETE", "/v1/internal/replicas/{replica_id}", None)

    async def table(self) -> ReplicaList:
        return await self.call(self.TABLE)

    async def heartbeat(
        self, replica_id: str, state: ReplicaHeartbeat, timeout: float
    ) -> ReplicaPublic:
        """Register or refresh the replica (one call); `timeout` in seconds."""
        return await self.call(self.HEARTBEAT, state, timeout=timeout, replica_id=replica_id)

    async def leave(self, replica_id: str, timeout: float) -> None:
        await self.call(self.LEAVE, timeout=timeout, replica_id=replica_id)
