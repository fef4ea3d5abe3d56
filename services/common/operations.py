"""Long work, one protocol: submit → operation id at once → poll or wait → result or error.

Operations with the same key (a trainer model, say) run strictly in submission order; their
bodies run on one shared worker thread, because they compete for one device anyway.
Status changes go through `_TRANSITIONS` only. A submission may carry an idempotency key
(chosen by the client, unique per key of the queue): sent again, after an answer that was lost,
it gets the first submission's operation instead of running twice. An operation submitted
inside a recorded trace runs in a span of its own, a child of the request that submitted it
(`tracing.span_in`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from services.common.busy import BusyClock
from services.common.errors import Conflict, InvalidTransition, LoomError, NotFound
from services.common.schemas import ErrorBody, Operation, OperationStatus
from services.common.tracing import capture, span_in

log = logging.getLogger(__name__)

_TRANSITIONS: dict[OperationStatus, frozenset[OperationStatus]] = {
    OperationStatus.pending: frozenset({OperationStatus.running, OperationStatus.failed}),
    OperationStatus.running: frozenset({OperationStatus.succeeded, OperationStatus.failed}),
    OperationStatus.succeeded: frozenset(),
    OperationStatus.failed: frozenset(),
}


def _now() -> datetime:
    return datetime.now(UTC)


# What a submission with an idempotency key is remembered by: (queue key, idempotency key).
_Submission = tuple[str, str]


class _Entry:
    def __init__(
        self, op: Operation, fn: Callable[[], Any], submission: _Submission | None, fingerprint: str
    ) -> None:
        self.op = op
        self.fn = fn
        self.submission = submission
        self.fingerprint = fingerprint  # the submitted request, to refuse a key used twice
        self.done = asyncio.Event()
        self.trace = capture()  # the submitting request's, when it is traced

    def run(self) -> Any:
        """The body, on the executor's thread, in its span (when traced)."""
        queued_s = (
            (self.op.started_at - self.op.created_at).total_seconds()
            if (self.op.started_at)
            else 0.0
        )
        with span_in(
            self.trace,
            f"operation {self.op.kind}",
            attributes={"loom.operation_id": self.op.id, "loom.queued_s": queued_s},
        ):
            return self.fn()

    def move(self, status: OperationStatus, **changes: Any) -> None:
        if status not in _TRANSITIONS[self.op.status]:
            raise InvalidTransition(f"operation {self.op.id}: {self.op.status} -> {status}")
        self.op = self.op.model_copy(update={"status": status, **changes})
        if self.op.done:
            self.done.set()


class OperationQueue:
    def __init__(self, history: int = 10_000, busy: BusyClock | None = None) -> None:
        self._busy = busy or BusyClock("operations_busy_seconds", "Operations running")
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._submissions: dict[_Submission, _Entry] = {}
        self._queues: dict[str, asyncio.Queue[_Entry]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loom-op")
        self._history = history

    def submit(
        self,
        key: str,
        kind: str,
        fn: Callable[[], Any],
        *,
        idempotency_key: str | None = None,
        fingerprint: str = "",
    ) -> Operation:
        """Queue `fn` behind `key`'s earlier operations. With `idempotency_key`, a submission
        of the same `kind` and `fingerprint` (the request) seen before, and still kept, is
        answered with that operation as it stands; another request with the key is refused."""
        submission = None if idempotency_key is None else (key, idempotency_key)
        if submission is not None and (seen := self._submissions.get(submission)):
            if (seen.op.kind, seen.fingerprint) != (kind, fingerprint):
                raise Conflict(
                    f"Idempotency key {idempotency_key!r} was used for another request "
                    f"({seen.op.kind}, operation {seen.op.id}); send a new key."
                )
            return seen.op
        op = Operation(
            id=f"op_{uuid.uuid4().hex}",
            kind=kind,
            status=OperationStatus.pending,
            created_at=_now(),
        )
        entry = _Entry(op, fn, submission, fingerprint)
        self._entries[op.id] = entry
        if submission is not None:
            self._submissions[submission] = entry
        self._forget_oldest()
        queue = self._queues.setdefault(key, asyncio.Queue())
        queue.put_nowait(entry)
        if key not in self._workers or self._workers[key].done():
            self._workers[key] = asyncio.get_running_loop().create_task(self._drain(queue))
        return op

    def get(self, op_id: str) -> Operation:
        entry = self._entries.get(op_id)
        if entry is None:
            raise NotFound(f"No operation {op_id!r} (unknown, or too old to be kept).")
        return entry.op

    async def wait(self, op_id: str, timeout: float) -> Operation:
        """The operation once done, or as it stands after `timeout` seconds (long-poll)."""
        entry = self._entries.get(op_id)
        if entry is None:
            raise NotFound(f"No operation {op_id!r} (unknown, or too old to be kept).")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(entry.done.wait(), timeout)
        return entry.op

    def pending_count(self, key: str) -> int:
        queue = self._queues.get(key)
        return queue.qsize() if queue else 0

    async def _drain(self, queue: asyncio.Queue[_Entry]) -> None:
        loop = asyncio.get_running_loop()
        while not queue.empty():
            entry = queue.get_nowait()
            entry.move(OperationStatus.running, started_at=_now())
            try:
                with self._busy.busy():
                    result = await loop.run_in_executor(self._executor, entry.run)
            except LoomError as exc:
                entry.move(
                    OperationStatus.failed,
                    finished_at=_now(),
                    error=ErrorBody(code=exc.code, message=exc.message, detail=exc.detail),
                )
            except Exception as exc:
                log.exception("operation %s failed", entry.op.id)
                entry.move(
                    OperationStatus.failed,
                    finished_at=_now(),
                    error=ErrorBody(code="internal_error", message=f"{type(exc).__name__}: {exc}"),
                )
            else:
                entry.move(OperationStatus.succeeded, finished_at=_now(), result=result)

    def _forget_oldest(self) -> None:
        while len(self._entries) > self._history:
            oldest_id, oldest = next(iter(self._entries.items()))
            if not oldest.op.done:
                break
            del self._entries[oldest_id]
            if oldest.submission is not None:
                del self._submissions[oldest.submission]

    def shutdown(self) -> None:
        for task in self._workers.values():
            task.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
