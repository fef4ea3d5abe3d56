"""A process pool for verifiers that may hang, with a deadline per call.

A timed-out call may still be running in its worker (stuck in C code, where no signal reaches
Python), so the whole pool is replaced: its processes are killed and calls that were running in
it are retried once on the new pool. Workers are spawned (not forked: the service has threads),
and a call's deadline starts only once every worker of the pool has started and warmed up, so
slow start-up is never mistaken for a hung call.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

STARTUP_TIMEOUT_S = 300.0


def _start_worker(initializer: Callable[[], None] | None, ready: threading.Barrier) -> None:
    if initializer is not None:
        initializer()
    ready.wait(STARTUP_TIMEOUT_S)


def _noop() -> None:
    """Submitted once per worker at start: a spawn pool only starts a worker for a call."""


@dataclass
class _Generation:
    executor: ProcessPoolExecutor
    barrier: threading.Barrier
    ready: asyncio.Task[None]

    def kill(self, wait: bool = False) -> None:
        self.barrier.abort()
        # No public API kills a busy worker; shutdown() alone would wait for it for ever.
        for process in list(getattr(self.executor, "_processes", {}).values()):
            process.kill()
        self.executor.shutdown(wait=wait, cancel_futures=True)


class WorkerPool:
    def __init__(self, workers: int, initializer: Callable[[], None] | None = None) -> None:
        self.workers = workers
        self._initializer = initializer
        self._generation = self._start()
        # At most one call per worker in flight, so a call's deadline measures its run time,
        # not time spent queued behind others.
        self._slots = asyncio.Semaphore(workers)
        self.replaced = 0

    def _start(self) -> _Generation:
        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(self.workers + 1)
        executor = ProcessPoolExecutor(
            self.workers,
            mp_context=context,
            initializer=_start_worker,
            initargs=(self._initializer, barrier),
        )
        calls = [asyncio.wrap_future(executor.submit(_noop)) for _ in range(self.workers)]
        for call in calls:  # a pool that fails to start fails them all: ready reports it once
            call.add_done_callback(lambda done: done.cancelled() or done.exception())

        async def wait_ready() -> None:
            await asyncio.to_thread(barrier.wait, STARTUP_TIMEOUT_S)
            await asyncio.gather(*calls)

        return _Generation(executor, barrier, asyncio.get_running_loop().create_task(wait_ready()))

    async def ready(self) -> None:
        await self._generation.ready

    async def run(self, timeout_s: float, fn: Callable[..., Any], *args: Any) -> Any:
        async with self._slots:
            for attempt in range(2):
                generation = self._generation
                try:
                    await generation.ready
                    future = asyncio.get_running_loop().run_in_executor(
                        generation.executor, fn, *args
                    )
                    return await asyncio.wait_for(future, timeout_s)
                except TimeoutError:
                    self._replace(generation)
                    raise
                except (BrokenProcessPool, threading.BrokenBarrierError):
                    if generation is self._generation:  # a worker died on this call
                        self._replace(generation)
                        raise
                    # Killed under us because another call timed out: ours did nothing wrong.
                    if attempt == 0:
                        continue
                    raise
        raise AssertionError("unreachable")

    def _replace(self, generation: _Generation) -> None:
        if generation is not self._generation:
            return  # someone already replaced it
        self._generation = self._start()
        self.replaced += 1
        generation.kill()

    async def shutdown(self) -> None:
        generation = self._generation
        generation.ready.cancel()
        await asyncio.to_thread(generation.kill, True)
        with contextlib.suppress(BaseException):
            await generation.ready
