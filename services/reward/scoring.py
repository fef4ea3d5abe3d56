"""Batch scoring: each failure confined to its own item (and, in a request of several batches,
to its own batch). Inline verifiers score a batch in one go on the event loop, thread ones in
one hop to the scorer's threads; worker and sandbox ones concurrently, an item per call."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from services.common.app_factory import json_safe
from services.common.errors import InvalidInput, LoomError
from services.common.schemas import ErrorBody
from services.reward.functions import FunctionStore
from services.reward.sandboxed import PythonParams
from services.reward.schemas import (
    ItemScore,
    ScoreBatchRequest,
    ScoreBatchResponse,
    ScoreItem,
    ScoreRequest,
    ScoreResponse,
    ScoreResult,
)
from services.reward.verifiers import Score, Verifier, resolve, run_verifier
from services.reward.workers import WorkerPool
from services.sandbox.client import SandboxClient
from services.sandbox.schemas import ExecuteRequest, ExecuteResponse

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Batch:
    verifier: Verifier
    params: Any
    items: list[ScoreItem]


class Scorer:
    def __init__(
        self,
        pool: WorkerPool,
        item_timeout_s: float,
        sandbox: SandboxClient | None = None,
        sandbox_concurrency: int = 8,
        functions: FunctionStore | None = None,
        threads: int = 2,
    ) -> None:
        self.pool = pool
        self.functions = functions
        self.item_timeout_s = item_timeout_s
        self.sandbox = sandbox
        self._sandbox_slots = asyncio.Semaphore(sandbox_concurrency)
        # Threads of its own: a batch of slow patterns must not hold up other to_thread work.
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="reward-verify")

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def run_in_sandbox(self, request: ExecuteRequest) -> ExecuteResponse:
        """One execution in the sandbox service, at most `sandbox_concurrency` at a time."""
        if self.sandbox is None:
            raise RuntimeError("no sandbox service is configured")
        async with self._sandbox_slots:
            return await self.sandbox.execute(request)

    async def score(self, request: ScoreRequest) -> ScoreResponse:
        verifier, params = self._resolve(request)
        (scores,) = await self._score_all([_Batch(verifier, params, request.items)])
        return ScoreResponse(verifier=verifier.name, scores=scores)

    async def score_batches(self, request: ScoreBatchRequest) -> ScoreBatchResponse:
        """Every batch at once; one that cannot be scored gets its error, not the others."""
        results: list[ScoreResult] = []
        batches: list[_Batch] = []
        for batch in request.batches:
            try:
                verifier, params = self._resolve(batch)
            except LoomError as exc:
                results.append(
                    ScoreResult(
                        verifier=batch.verifier,
                        error=ErrorBody(
                            code=exc.code, message=exc.message, detail=json_safe(exc.detail)
                        ),
                    )
                )
                continue
            results.append(ScoreResult(verifier=verifier.name))
            batches.append(_Batch(verifier, params, batch.items))
        scored = iter(await self._score_all(batches))
        for result in results:
            if result.error is None:
                result.scores = next(scored)
        return ScoreBatchResponse(results=results)

    def _resolve(self, request: ScoreRequest) -> tuple[Verifier, Any]:
        verifier, params = resolve(request.verifier, request.params, request.items)
        if isinstance(params, PythonParams) and params.function is not None:
            if self.functions is None:
                raise InvalidInput("this reward service keeps no registered functions")
            code = self.functions.get(params.function, params.job_id).code
            params = params.model_copy(update={"code": code})
        return verifier, params

    async def _score_all(self, batches: list[_Batch]) -> list[list[ItemScore]]:
        """The scores of each batch: the thread verifiers' batches all in one hop, worker and
        sandbox items each a call of its own, inline batches here while those run."""
        threaded = [b for b in batches if b.verifier.runs_in == "thread"]
        in_thread = (
            asyncio.get_running_loop().run_in_executor(
                self._threads, self._score_threaded, threaded
            )
            if threaded
            else None
        )
        awaited = {
            id(b): asyncio.gather(
                *(self._score_item(b.verifier, b.params, item) for item in b.items)
            )
            for b in batches
            if b.verifier.runs_in in ("worker", "sandbox")
        }
        scores: dict[int, list[ItemScore]] = {
            id(b): self._each(
                b, lambda item, b=b: b.verifier.score(item.response, item.reference, b.params)
            )
            for b in batches
            if b.verifier.runs_in == "inline"
        }
        if in_thread is not None:
            scores.update(zip(map(id, threaded), await in_thread, strict=True))
        for key, pending in awaited.items():
            scores[key] = list(await pending)
        return [scores[id(b)] for b in batches]

    def _score_threaded(self, batches: list[_Batch]) -> list[list[ItemScore]]:
        return [
            self._each(
                b,
                lambda item, b=b: b.verifier.score(
                    item.response, item.reference, b.params, self.item_timeout_s
                ),
            )
            for b in batches
        ]

    def _each(self, batch: _Batch, score: Callable[[ScoreItem], Score]) -> list[ItemScore]:
        scores = []
        for item in batch.items:
            try:
                reward, detail = score(item)
            except Exception as exc:  # one bad item must not fail the batch
                scores.append(self._failed(batch.verifier, exc))
            else:
                scores.append(ItemScore(reward=reward, detail=detail))
        return scores

    async def _score_item(self, verifier: Verifier, params: object, item: ScoreItem) -> ItemScore:
        try:
            if verifier.runs_in == "worker":
                reward, detail = await self.pool.run(
                    self.item_timeout_s,
                    run_verifier,
                    verifier.name,
                    item.response,
                    item.reference,
                    params,
                )
            else:
                reward, detail = await asyncio.wait_for(
                    verifier.score(self.run_in_sandbox, item.response, item.reference, params),
                    self.item_timeout_s,
                )
        except Exception as exc:  # one bad item must not fail the batch
            return self._failed(verifier, exc)
        return ItemScore(reward=reward, detail=detail)

    def _failed(self, verifier: Verifier, exc: Exception) -> ItemScore:
        if isinstance(exc, TimeoutError):
            return ItemScore(reward=0.0, error=f"timed out after {self.item_timeout_s:g} s")
        log.info("verifier %s failed on an item: %r", verifier.name, exc)
        return ItemScore(reward=0.0, error=f"{type(exc).__name__}: {exc}")
