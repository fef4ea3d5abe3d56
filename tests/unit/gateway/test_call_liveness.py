"""A call that answers later, on a gateway replica that dies while it runs: another replica's
poll fails it with an error the SDK can act on, instead of a poll that never ends; a replica
that lives keeps its long calls pending."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from gateway.compat.common.futures import Futures
from services.common.errors import Unavailable

STALE = timedelta(seconds=0.3)


async def test_a_call_whose_replica_stops_renewing_it_fails_for_every_poller(
    gateway_db: sessionmaker[Session],
) -> None:
    never = asyncio.Event()
    # the replica that took the call renews nothing: as if its process had died
    dead = Futures(gateway_db, "a", heartbeat_s=3600)
    other = Futures(gateway_db, "b", stale_after=STALE)
    third = Futures(gateway_db, "c", stale_after=STALE)

    async def forever() -> dict[str, int]:
        await never.wait()
        return {"x": 1}

    call_id = await dead.submit(forever())
    outcome = await other.wait(call_id, 2)
    assert outcome is not None and isinstance(outcome.error, Unavailable)
    assert outcome.error.detail == {"call_id": call_id, "reason": "gateway_replica_lost"}
    assert "send the call again" in outcome.error.message
    again = await third.wait(call_id, 0)  # the same answer from a replica that polls later
    assert again is not None and again.error is not None
    assert again.error.code == outcome.error.code == "unavailable"
    # the call ending late on its replica does not turn the answer given into another one
    never.set()
    await asyncio.sleep(0.05)
    late = await third.wait(call_id, 0)
    assert late is not None and late.result is None and late.error is not None


async def test_a_long_call_on_a_live_replica_stays_pending_then_answers(
    gateway_db: sessionmaker[Session],
) -> None:
    finish = asyncio.Event()
    live = Futures(gateway_db, "a", heartbeat_s=0.05)
    other = Futures(gateway_db, "b", stale_after=STALE)

    async def slow() -> dict[str, int]:
        await finish.wait()
        return {"x": 1}

    call_id = await live.submit(slow())
    assert await other.wait(call_id, 1.0) is None  # 3x the stale time, renewed all along
    finish.set()
    outcome = await other.wait(call_id, 2)
    assert outcome is not None and outcome.result == {"x": 1} and outcome.error is None
