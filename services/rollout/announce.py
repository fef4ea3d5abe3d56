"""A rollout replica announces itself to the gateway and keeps a heartbeat: its URL, readiness,
the versions its engine holds and its load. The gateway routes by it, drops the replica when
the heartbeats stop and adds it back when they resume; leaving on purpose (shutdown, scaling
down) says so at once, so no new request is sent to a replica that is going away."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from services.common.errors import LoomError
from services.rollout.gateway_calls import GatewayReplicas
from services.rollout.schemas import ReplicaHeartbeat

log = logging.getLogger(__name__)
LEAVE_TIMEOUT_S = 2.0


class Announcer:
    def __init__(
        self,
        gateway: GatewayReplicas,
        replica_id: str,
        heartbeat_s: float,
        state: Callable[[], ReplicaHeartbeat],
    ) -> None:
        self.gateway = gateway
        self.replica_id = replica_id
        self.heartbeat_s = heartbeat_s
        self.state = state
        self.registered = False
        self.draining = False
        self._failing = False

    async def beat(self) -> None:
        """One heartbeat; a gateway that is down or refuses is logged once, not raised."""
        try:
            await self.gateway.heartbeat(self.replica_id, self.state(), self.heartbeat_s)
        except LoomError as exc:
            if not self._failing:
                log.warning(
                    "cannot register with the gateway (%s); retrying every %.1f s",
                    exc.message,
                    self.heartbeat_s,
                )
            self._failing, self.registered = True, False
            return
        if not self.registered:
            log.info("registered with the gateway as replica %s", self.replica_id)
        self._failing, self.registered = False, True
        if self.draining:  # drained while this beat was on its way: leave again
            await self.leave()

    async def run(self) -> None:
        """Heartbeat until cancelled or drained."""
        while not self.draining:
            await self.beat()
            await asyncio.sleep(self.heartbeat_s)

    async def drain(self) -> None:
        """Stop the heartbeats and leave the gateway's table, so nothing new is sent here while
        the requests already running finish (before a replica is scaled away)."""
        self.draining = True
        await self.leave()

    async def leave(self) -> None:
        """Tell the gateway this replica is going away (best effort: its heartbeats stop
        anyway)."""
        with contextlib.suppress(LoomError):
            await self.gateway.leave(self.replica_id, LEAVE_TIMEOUT_S)
