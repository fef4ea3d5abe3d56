"""Futures for trainer operations: returned at once, awaited (or `.result()` in the sync face)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from services.common.schemas import Operation
from services.trainer.client import TrainerClient, operation_result

T = TypeVar("T", bound=BaseModel)


class OperationFuture(Generic[T]):
    """An operation queued on the trainer; operations of one job run in submission order."""

    operation: Operation  # as last polled

    def __init__(self, trainer: TrainerClient, operation: Operation, result_type: type[T]) -> None:
        self._trainer = trainer
        self._result_type = result_type
        self.operation = operation

    @property
    def id(self) -> str:
        return self.operation.id

    async def result(self, timeout: float | None = None) -> T:
        self.operation = await self._trainer.wait(self.operation, timeout)
        return self._result_type.model_validate(operation_result(self.operation))

    def __await__(self) -> Generator[Any, None, T]:
        return self.result().__await__()

    def __repr__(self) -> str:
        return f"<OperationFuture {self.operation.kind} {self.id} {self.operation.status.value}>"
