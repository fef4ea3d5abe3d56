"""Background tasks in the SDK: garbage collection, evaluation of a version on a held-out set,
export of a LoRA version merged into a full model, run by Loom's worker. Submitting returns at
once; `wait()` polls until the task is done, `result()` also returns what it produced."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pydantic import BaseModel, TypeAdapter

from agents.sdk._http import GatewayHttp
from services.common.errors import LoomError, error_from_envelope
from services.worker.schemas import TASK_RESULTS, TaskKind
from services.worker.task_schemas import BackgroundTask, BackgroundTaskList, TaskCreate, TaskStatus

MAX_POLL_S = 2.0


class AsyncTask:
    """A background task on Loom's worker (`info` as last fetched)."""

    info: BackgroundTask

    def __init__(self, http: GatewayHttp, info: BackgroundTask) -> None:
        self._http = http
        self.info = info

    @classmethod
    async def submit(
        cls,
        http: GatewayHttp,
        job_id: str,
        kind: TaskKind | str,
        params: BaseModel | dict[str, Any] | None,
        idempotency_key: str | None,
    ) -> AsyncTask:
        if isinstance(params, BaseModel):
            params = params.model_dump(mode="json")
        request = TypeAdapter(TaskCreate).validate_python(
            {"kind": str(kind), "params": params or {}, "idempotency_key": idempotency_key}
        )
        body = await http.post_json(f"/v1/jobs/{job_id}/tasks", request.model_dump(mode="json"))
        return cls(http, BackgroundTask.model_validate(body))

    @property
    def id(self) -> str:
        return self.info.id

    async def refresh(self) -> BackgroundTask:
        self.info = BackgroundTask.model_validate(await self._http.get_json(self._path))
        return self.info

    async def wait(self, timeout: float | None = None) -> BackgroundTask:
        """The task once succeeded, failed or cancelled (TimeoutError after `timeout` s)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        poll = 0.1
        while not self.info.done:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"task {self.id} still {self.info.status.value} after {timeout} s"
                )
            await asyncio.sleep(poll)
            poll = min(poll * 2, MAX_POLL_S)
            await self.refresh()
        return self.info

    async def result(self, timeout: float | None = None) -> BaseModel:
        """What the task produced (GcReport, EvaluateResult, ExportResult); its error, typed,
        if it failed."""
        info = await self.wait(timeout)
        if info.status is TaskStatus.succeeded:
            return TASK_RESULTS[info.kind].model_validate(info.result)
        if info.error is not None:
            raise error_from_envelope(400, {"error": info.error.model_dump()})
        raise LoomError(f"Task {self.id} was {info.status.value}.")

    async def cancel(self) -> BackgroundTask:
        return await self._post("cancel")

    async def retry(self) -> BackgroundTask:
        """Queue a failed task again."""
        return await self._post("retry")

    async def _post(self, action: str) -> BackgroundTask:
        body = await self._http.post_json(f"{self._path}/{action}")
        self.info = BackgroundTask.model_validate(body)
        return self.info

    @property
    def _path(self) -> str:
        return f"/v1/tasks/{self.id}"

    def __repr__(self) -> str:
        return f"<Task {self.info.kind.value} {self.id} {self.info.status.value}>"


async def list_tasks(http: GatewayHttp, job_id: str) -> list[BackgroundTask]:
    return BackgroundTaskList.model_validate(await http.get_json(f"/v1/jobs/{job_id}/tasks")).tasks
