"""The services agent loops call: the sandbox runs tools, the reward service scores episodes."""

from __future__ import annotations

import asyncio
from typing import Any

from services.common.errors import LoomError, error_from_envelope
from services.reward.client import RewardClient
from services.reward.schemas import (
    MAX_ITEMS,
    ScoreBatchRequest,
    ScoreItem,
    ScoreRequest,
    ScoreResponse,
)
from services.sandbox.client import SandboxClient
from services.sandbox.schemas import ExecuteRequest, ExecuteResponse

# How long the first group waiting to be scored waits for others. A step's groups finish on
# the same few engine steps (milliseconds apart); gathered, they cost one request instead of
# one each (16 a step, each paying HTTP, parsing and the event loop's turn).
GATHER_S = 0.002


class SandboxTools:
    """`services.rollout.environments.Tools` on the sandbox service."""

    def __init__(self, client: SandboxClient) -> None:
        self.client = client

    async def run_python(self, code: str, *, timeout_s: float) -> ExecuteResponse:
        return await self.client.execute(ExecuteRequest(code=code, timeout_s=timeout_s))


Waiting = tuple[ScoreRequest, asyncio.Future[ScoreResponse]]


class RewardScorer:
    """Scores a group's episodes; groups that ask within `gather_s` of each other go out as
    one `POST /v1/score/batch`, each its own batch, so one group's error (say a missing
    reference) stays its own."""

    def __init__(self, client: RewardClient, gather_s: float = GATHER_S) -> None:
        self.client = client
        self.gather_s = gather_s
        self._waiting: list[Waiting] = []
        self._sending: set[asyncio.Task[None]] = set()

    async def score(
        self, verifier: str, items: list[ScoreItem], params: dict[str, Any]
    ) -> ScoreResponse:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ScoreResponse] = loop.create_future()
        self._waiting.append((ScoreRequest(verifier=verifier, items=items, params=params), future))
        if len(self._waiting) == 1:
            loop.call_later(self.gather_s, self._send_waiting)
        return await future

    def _send_waiting(self) -> None:
        waiting, self._waiting = self._waiting, []
        for chunk in _chunks(waiting):
            task = asyncio.create_task(self._send(chunk))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, waiting: list[Waiting]) -> None:
        try:
            results = (
                await self.client.score_batch(
                    ScoreBatchRequest(batches=[batch for batch, _ in waiting])
                )
            ).results
        except Exception as exc:  # the whole call failed: every group it carried learns why
            for _, future in waiting:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(waiting, results, strict=True):
            if future.done():  # its group was cancelled meanwhile
                continue
            if result.error is not None:
                future.set_exception(_error(result.error.model_dump()))
            else:
                future.set_result(ScoreResponse(verifier=result.verifier, scores=result.scores))


def _chunks(waiting: list[Waiting]) -> list[list[Waiting]]:
    """Requests of at most MAX_ITEMS items in all (one group is never split)."""
    chunks: list[list[Waiting]] = [[]]
    size = 0
    for entry in waiting:
        items = len(entry[0].items)
        if chunks[-1] and size + items > MAX_ITEMS:
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += items
    return chunks


def _error(error: dict[str, Any]) -> LoomError:
    return error_from_envelope(422, {"error": error})
