"""What the worker asks of the gateway (the layer above it, reached over HTTP only): a
managed run's job key, and the end of a task whose end moves rows the gateway owns (a run's
job, an evaluation's metrics). Internal routes, sent with the service token; each is a PUT
or DELETE that does the same thing once however often it is sent, so the client re-sends
one whose answer was lost. Built with `service_token.client_of(settings, GatewayCalls)`."""

from __future__ import annotations

from services.common.http import Route, ServiceClient
from services.worker.task_schemas import RunKey, TaskEnd, TaskEnded


class GatewayCalls(ServiceClient):
    SERVICE = "gateway"
    RENEW_RUN_KEY = Route("PUT", "/v1/internal/jobs/{job_id}/run-key", RunKey)
    DROP_RUN_KEY = Route("DELETE", "/v1/internal/jobs/{job_id}/run-key", None)
    END_TASK = Route("PUT", "/v1/internal/tasks/{task_id}/end", TaskEnded, TaskEnd)

    async def renew_run_key(self, job_id: str) -> str:
        """A key acting for the job only; the job's earlier run key is revoked."""
        return (await self.call(self.RENEW_RUN_KEY, job_id=job_id)).secret

    async def drop_run_key(self, job_id: str) -> None:
        await self.call(self.DROP_RUN_KEY, job_id=job_id)

    async def end_task(self, task_id: str, end: TaskEnd) -> bool:
        """Whether the end was recorded (False: the attempt had lost its task)."""
        return (await self.call(self.END_TASK, end, task_id=task_id)).ended
