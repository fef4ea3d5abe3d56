"""The stack's health as `/v1/health` and the web admin show it: the gateway itself, the
workers (from their liveness rows) and every upstream service (probed)."""

from __future__ import annotations

from starlette.datastructures import State

from gateway.models import utcnow
from gateway.schemas import StackHealth
from services.common.db import in_transaction
from services.common.schemas import Health
from services.worker.liveness import worker_health


async def stack_health(state: State, gateway_version: str) -> StackHealth:
    """An unreachable service is a row, never an error."""
    gateway = Health(service="gateway", status="ready", version=gateway_version)
    workers = await in_transaction(
        state.sessions, lambda s: worker_health(s, utcnow(), state.worker_stale_after_s)
    )
    return await state.upstreams.health(gateway, workers)
