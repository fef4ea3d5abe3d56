"""Batch scoring: every item scored concurrently, each failure confined to its own item."""

from __future__ import annotations

import asyncio
import logging

from services.common.errors import InvalidInput
from services.common.http import ServiceClient
from services.reward.functions import FunctionStore
from services.reward.sandboxed import PythonParams
from services.reward.schemas import ItemScore, ScoreItem, ScoreRequest, ScoreResponse
from services.reward.verifiers import Verifier, resolve, run_verifier
from services.reward.workers import WorkerPool
from services.sandbox.schemas import ExecuteRequest, ExecuteResponse

log = logging.getLogger(__name__)


class Scorer:
    def __init__(self, pool: WorkerPool, item_timeout_s: float,
                 sandbox: ServiceClient | None = None, sandbox_concurrency: int = 8,
                 functions: FunctionStore | None = None) -> None:
        self.pool = pool
        self.functions = functions
        self.item_timeout_s = item_timeout_s
        self.sandbox = sandbox
        self._sandbox_slots = asyncio.Semaphore(sandbox_concurrency)

    async def run_in_sandbox(self, request: ExecuteRequest) -> ExecuteResponse:
        """One execution in the sandbox service, at most `sandbox_concurrency` at a time."""
        if self.sandbox is None:
            raise RuntimeError("no sandbox service is configured")
        async with self._sandbox_slots:
            body = await self.sandbox.post_json("/v1/execute", request.model_dump(mode="json"))
        return ExecuteResponse.model_validate(body)

    async def score(self, request: ScoreRequest) -> ScoreResponse:
        verifier, params = resolve(request.verifier, request.params, request.items)
        if isinstance(params, PythonParams) and params.function is not None:
            if self.functions is None:
                raise InvalidInput("this reward service keeps no registered functions")
            code = self.functions.get(params.function, params.job_id).code
            params = params.model_copy(update={"code": code})
        scores = await asyncio.gather(*(self._score_item(verifier, params, item)
                                        for item in request.items))
        return ScoreResponse(verifier=verifier.name, scores=list(scores))

    async def _score_item(self, verifier: Verifier, params: object,
                          item: ScoreItem) -> ItemScore:
        try:
            if verifier.runs_in == "worker":
                reward, detail = await self.pool.run(self.item_timeout_s, run_verifier,
                                                     verifier.name, item.response,
                                                     item.reference, params)
            elif verifier.runs_in == "sandbox":
                reward, detail = await asyncio.wait_for(
                    verifier.score(self.run_in_sandbox, item.response, item.reference, params),
                    self.item_timeout_s)
            else:
                reward, detail = verifier.score(item.response, item.reference, params)
        except TimeoutError:
            return ItemScore(reward=0.0, error=f"timed out after {self.item_timeout_s:g} s")
        except Exception as exc:  # one bad item must not fail the batch
            log.info("verifier %s failed on an item: %r", verifier.name, exc)
            return ItemScore(reward=0.0, error=f"{type(exc).__name__}: {exc}")
        return ItemScore(reward=reward, detail=detail)
