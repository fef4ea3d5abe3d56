"""Streamed rollouts in the SDK: groups of trajectories arrive as the service finishes them.

stream = await job.rollouts(tasks, env="python_tool", group_size=8)
async for group in stream:
    ...
stream.errors   # groups that failed (their task_index in `detail`): retry those tasks
stream.summary  # after the last group
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2

from agents.sdk._http import GatewayHttp
from services.common.schemas import ErrorBody
from services.rollout.schemas import RolloutEvent, RolloutGroup, RolloutRequest, RolloutSummary

ROLLOUTS_PATH = "/v1/rollout/rollouts"


class AsyncRolloutStream:
    errors: list[ErrorBody]
    summary: RolloutSummary | None

    def __init__(self, response: httpx2.Response) -> None:
        self._response = response
        self.errors: list[ErrorBody] = []
        self.summary: RolloutSummary | None = None

    @classmethod
    async def open(cls, http: GatewayHttp, request: RolloutRequest) -> AsyncRolloutStream:
        """Sends the request; a refused one (4xx) raises here, before any group."""
        built = http.http.build_request("POST", ROLLOUTS_PATH, json=request.model_dump(mode="json"))
        response = await http.http.send(built, stream=True)
        if response.status_code >= 400:
            await response.aread()
            await response.aclose()
            http.raise_for_status(response)
        return cls(response)

    def __aiter__(self) -> AsyncIterator[RolloutGroup]:
        return self._groups()

    async def _groups(self) -> AsyncIterator[RolloutGroup]:
        async for event in self.events():
            if event.group is not None:
                yield event.group

    async def events(self) -> AsyncIterator[RolloutEvent]:
        """Every event as it arrives: groups, errors (each group that failed, as soon as it
        did) and the summary; errors and summary are also kept on the stream."""
        try:
            async for line in self._response.aiter_lines():
                if not line.strip():
                    continue
                event = RolloutEvent.model_validate_json(line)
                if event.error is not None:
                    self.errors.append(event.error)
                elif event.summary is not None:
                    self.summary = event.summary
                yield event
        finally:
            await self._response.aclose()

    async def collect(self) -> list[RolloutGroup]:
        """Every group, in the order they completed."""
        return [group async for group in self]

    async def aclose(self) -> None:
        """Stop early: the service cancels the groups still running."""
        await self._response.aclose()
