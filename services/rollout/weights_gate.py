"""A readers-writer gate over the engine's full weights (one set at a time per engine).

Samples hold a shared hold on the weights they need for as long as they generate. Asking for
other weights waits until in-flight holds are released, blocks new holds on the old weights
meanwhile (so a swap cannot starve), swaps, then admits everyone waiting for the new weights.
A request that started on weights k therefore finishes on k.

Partial rollouts hold *movable*: weights that `succeeds` names a later version of theirs may
be swapped in under them (the engine then carries their generations over, see
`RolloutEngine.reload_weights`), and they may join such weights when those are loaded. Only
pinned holds, or movable ones facing unrelated weights, make a swap wait. `swap_if_idle`
loads weights ahead of any request for them, only while nothing holds or waits for the engine.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

UNKNOWN_WEIGHTS = ""  # after a failed swap the weights may be half replaced

Swap = Callable[[], Awaitable[None]]
Succeeds = Callable[[str, str], bool]  # (newer, older): whether newer is a later version


def _unrelated(newer: str, older: str) -> bool:
    return False


class WeightsGate:
    def __init__(self, loaded: str, succeeds: Succeeds = _unrelated) -> None:
        self.loaded = loaded
        self.swaps = 0
        self._succeeds = succeeds
        self._holders = 0  # pinned: their weights stay until they finish
        self._movers = 0  # movable holders of the loaded weights
        self._swapping = False
        self._waiting: Counter[str] = Counter()
        self._cond = asyncio.Condition()

    @property
    def holders(self) -> int:
        return self._holders + self._movers

    @asynccontextmanager
    async def hold(self, weights: str, swap: Swap, *, movable: bool = False) -> AsyncIterator[None]:
        """Hold `weights` loaded for the duration of the block; `swap` loads them if needed
        (it runs alone: no pinned holder is active and no other swap runs). `movable`: later
        versions of `weights` may replace them meanwhile (and may serve from the start)."""
        await self._acquire(weights, swap, movable)
        try:
            yield
        finally:
            async with self._cond:
                if movable:
                    self._movers -= 1
                else:
                    self._holders -= 1
                self._cond.notify_all()

    async def swap_if_idle(self, weights: str, swap: Swap) -> bool:
        """Swap `weights` in now, holding nothing, if no request holds or waits for the engine
        and no swap runs; otherwise do nothing and return False."""
        async with self._cond:
            if self._swapping or self.holders or self._waiting or self.loaded == weights:
                return False
            self._swapping = True
        await self._swap(weights, swap, None)
        return True

    async def _acquire(self, weights: str, swap: Swap, movable: bool) -> None:
        async with self._cond:
            arrived_at = self.swaps
            self._waiting[weights] += 1
            try:
                while True:
                    if self._may_join(weights, arrived_at, movable):
                        if movable:
                            self._movers += 1
                        else:
                            self._holders += 1
                        return
                    if not self._swapping and self.loaded != weights and self._may_swap(weights):
                        self._swapping = True
                        break
                    await self._cond.wait()
            finally:
                self._waiting[weights] -= 1
                if not self._waiting[weights]:
                    del self._waiting[weights]
                self._cond.notify_all()
        await self._swap(weights, swap, movable)

    def _may_swap(self, weights: str) -> bool:
        """No holder would end up on weights it cannot run on."""
        return self._holders == 0 and (self._movers == 0 or self._succeeds(weights, self.loaded))

    def _may_join(self, weights: str, arrived_at: int, movable: bool) -> bool:
        if self._swapping:
            return False
        if self.loaded != weights and not (movable and self._succeeds(self.loaded, weights)):
            return False
        others_waiting = any(w not in (weights, self.loaded) for w in self._waiting)
        # Waiters that were queued before the last swap go in together with it; newcomers
        # yield to anyone waiting for other weights.
        return not others_waiting or arrived_at < self.swaps

    async def _swap(self, weights: str, swap: Swap, movable: bool | None) -> None:
        """Run `swap`; then the caller holds the new weights, movable or pinned (None: no
        hold, a load ahead of requests)."""
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
            if movable is not None:
                if movable:
                    self._movers += 1
                else:
                    self._holders += 1
            self._cond.notify_all()
