"""The one mechanism behind the SDK's blocking face: a background event loop per client that
runs the async core's coroutines, and the base of every blocking class.

Each blocking method is written out (so IDEs and type checkers see it) and does nothing but
drive the matching coroutine here; tests/unit/agents/test_sdk_sync_face.py keeps the two
faces' methods and signatures equal."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")
A = TypeVar("A")


class LoopRunner:
    """An event loop on a daemon thread: the async core's objects live on it (httpx2's
    async client must be used on the loop that made it), callers block on their results."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="loom-sdk", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)

    def iterate(self, items: AsyncIterator[T]) -> Iterator[T]:
        """An async iterator's items, each awaited on the loop; closed when abandoned."""
        try:
            while True:
                try:
                    yield self.run(_next(items))
                except StopAsyncIteration:
                    return
        finally:
            close = getattr(items, "aclose", None)
            if close is not None:
                self.run(close())


async def _next(items: AsyncIterator[T]) -> T:
    return await anext(items)


class BlockingFace(Generic[A]):
    """A blocking view of one object of the async core, run on its client's loop."""

    def __init__(self, target: A, runner: LoopRunner) -> None:
        self._target = target
        self._runner = runner

    def __repr__(self) -> str:
        return repr(self._target)
