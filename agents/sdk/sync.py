"""The sync face, derived from the async core rather than written twice.

A `LoomClient` owns one background event loop; every coroutine method of the wrapped async
object runs there and blocks the caller until done. SDK objects that come back (jobs, futures)
are wrapped the same way, so `job.forward_backward(...).result()` blocks and
`await job.forward_backward(...)` is the async spelling of the same call.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

import httpx2

from agents.algorithms.algorithm import Algorithm
from agents.sdk._futures import OperationFuture
from agents.sdk.capture import AsyncCaptureSession
from agents.sdk.client import AsyncLoomClient
from agents.sdk.job import AsyncJob
from agents.sdk.pipeline import AsyncPipeline, StepResult
from agents.sdk.rollouts import AsyncRolloutStream
from agents.sdk.sandbox import AsyncSandboxSession
from agents.sdk.tasks import AsyncTask

T = TypeVar("T")


class _LoopThread:
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
                    yield self.run(items.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            close = getattr(items, "aclose", None)
            if close is not None:
                self.run(close())


class _Blocking:
    """Blocking view of an async SDK object."""

    def __init__(self, target: Any, runner: _LoopThread) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_runner", runner)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if inspect.iscoroutinefunction(attr):

            @functools.wraps(attr)
            def call(*args: Any, **kwargs: Any) -> Any:
                return self._wrap(self._runner.run(attr(*args, **kwargs)))

            return call
        return self._wrap(attr)

    def _wrap(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self._wrap(v) for v in value]
        face = _FACES.get(type(value))
        return face(value, self._runner) if face else value

    def __repr__(self) -> str:
        return repr(self._target)


class Job(_Blocking):
    """Blocking view of `AsyncJob`: the same methods; trainer calls return a `Future`.
    `with loom.create_job(...) as job:` ends the job with the block: completed, or failed
    (cancelled on Ctrl-C) when it raises."""

    def __enter__(self) -> Job:
        return self

    def __exit__(self, _type: object, error: BaseException | None, _tb: object) -> None:
        self._runner.run(self._target.__aexit__(_type, error, _tb))


class Future(_Blocking):
    """Blocking view of `OperationFuture`: `.result(timeout=None)` waits for the operation."""


class SandboxSession(_Blocking):
    """Blocking view of `AsyncSandboxSession`; a `with` block closes it."""

    def __enter__(self) -> SandboxSession:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class RolloutStream(_Blocking):
    """Blocking view of `AsyncRolloutStream`: iterate for groups as they complete."""

    def __iter__(self) -> Iterator[Any]:
        return self._runner.iterate(self._target.__aiter__())

    def events(self) -> Iterator[Any]:
        """Every event as it arrives: groups, errors, the summary."""
        return self._runner.iterate(self._target.events())


class CaptureSession(_Blocking):
    """Blocking view of `AsyncCaptureSession`."""


class Task(_Blocking):
    """Blocking view of `AsyncTask`: `job.submit_task("export").result()` waits for it."""


class Pipeline:
    """Blocking view of `AsyncPipeline`: `for step in Pipeline(job, algo, ...).run(n)`."""

    def __init__(self, job: Job, algorithm: Algorithm, **options: Any) -> None:
        self._runner: _LoopThread = job._runner
        self._pipeline = AsyncPipeline(job._target, algorithm, **options)

    def run(self, steps: int) -> Iterator[StepResult]:
        return self._runner.iterate(self._pipeline.run(steps))


class LoomClient(_Blocking):
    """Synchronous client: the same methods as `AsyncLoomClient`, blocking."""

    def __init__(
        self, url: str, api_key: str, *, transport: httpx2.AsyncBaseTransport | None = None
    ) -> None:
        runner = _LoopThread()
        # httpx2's async client must be created on the loop that will use it.
        client = runner.run(_make_client(url, api_key, transport))
        super().__init__(client, runner)

    def close(self) -> None:
        self._runner.run(self._target.aclose())
        self._runner.stop()

    def __enter__(self) -> LoomClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


async def _make_client(
    url: str, api_key: str, transport: httpx2.AsyncBaseTransport | None
) -> AsyncLoomClient:
    return AsyncLoomClient(url, api_key, transport=transport)


_FACES: dict[type, type[_Blocking]] = {AsyncJob: Job, OperationFuture: Future,
                                       AsyncSandboxSession: SandboxSession,
                                       AsyncRolloutStream: RolloutStream,
                                       AsyncCaptureSession: CaptureSession, AsyncTask: Task}
