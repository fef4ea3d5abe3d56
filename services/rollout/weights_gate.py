"""A readers-writer gate over the engine's full weights (one set at a time per engine).

Samples hold a shared hold on the weights they need for as long as they generate. Asking for
other weights waits until in-flight holds are released, blocks new holds on the old weights
meanwhile (so a swap cannot starve), swaps, then admits everyone waiting for the new weights.
A request that started on weights k therefore finishes on k. `swap_if_idle` loads weights
ahead of any request for them, only while nothing holds or waits for the engine.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

UNKNOWN_WEIGHTS = ""  # after a failed swap the weights may be half replaced

Swap = Callable[[], Awaitable[None]]


class WeightsGate:
    def __init__(self, loaded: str) -> None:
        self.loaded = loaded
        self.swaps = 0
        self._holders = 0
        self._swapping = False
        self._waiting: Counter[str] = Counter()
        self._cond = asyncio.Condition()

    @property
    def holders(self) -> int:
        return self._holders

    @asynccontextmanager
    async def hold(self, weights: str, swap: Swap) -> AsyncIterator[None]:
        """Hold `weights` loaded for the duration of the block; `swap` loads them if needed
        (it runs alone: no holder is active and no other swap runs)."""
        await self._acquire(weights, swap)
        try:
            yield
        finally:
            async with self._cond:
                self._holders -= 1
                self._cond.notify_all()

    async def swap_if_idle(self, weights: str, swap: Swap) -> bool:
        """Swap `weights` in now, holding nothing, if no request holds or waits for the engine
        and no swap runs; otherwise do nothing and return False."""
        async with self._cond:
            if self._swapping or self._holders or self._waiting or self.loaded == weights:
                return False
            self._swapping = True
        await self._swap(weights, swap, hold=False)
        return True

    async def _acquire(self, weights: str, swap: Swap) -> None:
        async with self._cond:
            arrived_at = self.swaps
            self._waiting[weights] += 1
            try:
                while True:
                    if self._may_join(weights, arrived_at):
                        self._holders += 1
                        return
                    if not self._swapping and self._holders == 0 and self.loaded != weights:
                        self._swapping = True
                        break
                    await self._cond.wait()
            finally:
                self._waiting[weights] -= 1
                if not self._waiting[weights]:
                    del self._waiting[weights]
                self._cond.notify_all()
        await self._swap(weights, swap)

    def _may_join(self, weights: str, arrived_at: int) -> bool:
        if self._swapping or self.loaded != weights:
            return False
        others_waiting = any(w != weights for w in self._waiting)
        # Waiters that were queued before the last swap go in together with it; newcomers
        # yield to anyone waiting for other weights.
        return not others_waiting or arrived_at < self.swaps

    async def _swap(self, weights: str, swap: Swap, hold: bool = True) -> None:
        try:
            await swap()
        except BaseException:
            async with self._cond:
                self._swapping = False
                self.loaded = UNKNOWN_WEIGHTS
                self._cond.notify_all()
            raise
        async with self._cond:
            self._swapping = False
            self.loaded = weights
            self.swaps += 1
            self._holders += hold
            self._cond.notify_all()
