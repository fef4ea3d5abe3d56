"""Futures for trainer operations: returned at once, awaited (or `.result()` in the sync face)."""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from agents.sdk._http import GatewayHttp
from services.common.errors import error_from_envelope
from services.common.schemas import Operation

T = TypeVar("T", bound=BaseModel)

POLL_WAIT_S = 30.0  # server-side long-poll per request


class OperationFuture(Generic[T]):
    """An operation queued on the trainer; operations of one job run in submission order."""

    operation: Operation  # as last polled

    def __init__(self, http: GatewayHttp, operation: Operation, result_type: type[T]) -> None:
        self._http = http
        self._result_type = result_type
        self.operation = operation

    @property
    def id(self) -> str:
        return self.operation.id

    async def result(self, timeout: float | None = None) -> T:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.operation.done:
            wait = POLL_WAIT_S
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
                if wait == 0.0:
                    raise TimeoutError(f"operation {self.id} not done after {timeout} s")
            body = await self._http.get_json(
                f"/v1/trainer/operations/{self.id}", params={"wait": wait}
            )
            self.operation = Operation.model_validate(body)
        if self.operation.error is not None:
            raise error_from_envelope(400, {"error": self.operation.error.model_dump()})
        return self._result_type.model_validate(self.operation.result)

    def __await__(self) -> Generator[Any, None, T]:
        return self.result().__await__()

    def __repr__(self) -> str:
        return f"<OperationFuture {self.operation.kind} {self.id} {self.operation.status.value}>"
