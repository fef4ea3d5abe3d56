"""The blocking face of the SDK: the async core's methods, each written out and run on the
client's own event loop (see `agents.sdk._runner`), so scripts without asyncio call them
directly and IDEs and type checkers see every method.

`LoomClient(url, key).create_job(...)` gives a `JobClient`; its trainer calls return a
`Future` (`job.forward_backward(...).result()` blocks), and `await job.forward_backward(...)`
is the async core's spelling of the same call.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal

import httpx2

from agents.algorithms.algorithm import Algorithm
from agents.sdk._runner import BlockingFace, LoopRunner
from agents.sdk.client import AsyncLoomClient
from agents.sdk.pipeline import AsyncPipeline, StepResult
from agents.sdk.sync_handles import CaptureSession, Future, RolloutStream, SandboxSession, Task
from agents.sdk.sync_job import JobClient
from gateway.schemas import StackHealth
from services.reward.schemas import (
    RewardFunction,
    ScoreBatchResponse,
    ScoreItem,
    ScoreRequest,
    ScoreResponse,
)
from services.rollout.schemas import (
    ChatMessage,
    RenderResponse,
    RolloutRequest,
    RolloutTask,
    SampleBatchRequest,
    SampleBatchResponse,
    SampleRequest,
    SampleResponse,
    SamplingParams,
    VersionRef,
)
from services.sandbox.schemas import ExecuteResponse
from services.trainer.schemas import AdamParams, LoraConfig, TrainingMode

__all__ = [
    "CaptureSession",
    "Future",
    "JobClient",
    "LoomClient",
    "Pipeline",
    "RolloutStream",
    "SandboxSession",
    "Task",
]


class LoomClient(BlockingFace[AsyncLoomClient]):
    """The SDK's blocking client: `LoomClient(url, api_key)`, the methods of
    `AsyncLoomClient`; `transport` lets tests run in-process. A `with` block closes it."""

    def __init__(
        self, url: str, api_key: str, *, transport: httpx2.AsyncBaseTransport | None = None
    ) -> None:
        runner = LoopRunner()
        # httpx2's async client must be created on the loop that will use it.
        super().__init__(runner.run(_make_client(url, api_key, transport)), runner)

    def health(self) -> StackHealth:
        """The stack's status and each service's health, as the gateway sees them."""
        return self._runner.run(self._target.health())

    def create_job(
        self,
        base_model: str,
        *,
        name: str = "job",
        mode: TrainingMode | str = TrainingMode.lora,
        lora: LoraConfig | None = None,
        config: dict[str, Any] | None = None,
    ) -> JobClient:
        """A new training job on `base_model` (full or LoRA training)."""
        job = self._runner.run(
            self._target.create_job(base_model, name=name, mode=mode, lora=lora, config=config)
        )
        return JobClient(job, self._runner)

    def get_task(self, task_id: str) -> Task:
        """A background task by id (see `JobClient.submit_task`)."""
        return Task(self._runner.run(self._target.get_task(task_id)), self._runner)

    def get_job(self, job_id: str) -> JobClient:
        """A client of the job `job_id`."""
        return JobClient(self._runner.run(self._target.get_job(job_id)), self._runner)

    def sample(self, request: SampleRequest) -> SampleResponse:
        """Completions of one prompt (see `JobClient.sample`)."""
        return self._runner.run(self._target.sample(request))

    def sample_batch(self, request: SampleBatchRequest) -> SampleBatchResponse:
        """Many prompts on one version in one request (see `JobClient.sample_many`)."""
        return self._runner.run(self._target.sample_batch(request))

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text (with the rollout engine's tokenizer), any number of texts."""
        return self._runner.run(self._target.tokenize(texts))

    def rollouts(self, request: RolloutRequest) -> RolloutStream:
        """Trajectories of an environment, streamed a group at a time (see
        `JobClient.rollouts`)."""
        return RolloutStream(self._runner.run(self._target.rollouts(request)), self._runner)

    def render(
        self, messages: Sequence[ChatMessage | dict[str, str]], tools: Sequence[dict[str, Any]] = ()
    ) -> RenderResponse:
        """A conversation as training tokens with the model's chat template: loss mask 1 on
        the assistant's turns, exactly as a rollout of it would be tokenised."""
        return self._runner.run(self._target.render(messages, tools))

    def capture(
        self,
        *,
        job_id: str | None = None,
        version: VersionRef = "latest",
        metadata: dict[str, Any] | None = None,
    ) -> CaptureSession:
        """A trajectory an OpenAI-speaking agent's calls are recorded into (see
        `JobClient.capture`)."""
        session = self._runner.run(
            self._target.capture(job_id=job_id, version=version, metadata=metadata)
        )
        return CaptureSession(session, self._runner)

    def score(
        self, verifier: str, items: Sequence[ScoreItem], params: dict[str, Any] | None = None
    ) -> ScoreResponse:
        """Rewards of `items` by the reward service's `verifier`."""
        return self._runner.run(self._target.score(verifier, items, params))

    def score_batches(self, batches: Sequence[ScoreRequest]) -> ScoreBatchResponse:
        """Several batches, each with its own verifier and params, in one request:
        `results[i]` scores `batches[i]`, or holds the error that stopped it."""
        return self._runner.run(self._target.score_batches(batches))

    def execute(self, code: str, **options: Any) -> ExecuteResponse:
        """Run a program in a fresh sandbox (`options`: `ExecuteRequest`'s other fields)."""
        return self._runner.run(self._target.execute(code, **options))

    def open_sandbox(
        self, *, job_id: str | None = None, image: str | None = None
    ) -> SandboxSession:
        """A sandbox session: files persist between programs (multi-turn tools)."""
        session = self._runner.run(self._target.open_sandbox(job_id=job_id, image=image))
        return SandboxSession(session, self._runner)

    def register_reward(self, name: str, code: str, job_id: str | None = None) -> RewardFunction:
        """Register (or replace) a reward function for the `python` verifier; it runs in the
        sandbox, never in the reward service."""
        return self._runner.run(self._target.register_reward(name, code, job_id))

    def close(self) -> None:
        """Close the connections and stop the client's loop."""
        self._runner.run(self._target.aclose())
        self._runner.stop()

    def __enter__(self) -> LoomClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class Pipeline(BlockingFace[AsyncPipeline]):
    """The RL loop of `AsyncPipeline`, blocking: `for step in Pipeline(job, algo, ...).run(n)`."""

    def __init__(
        self,
        job: JobClient,
        algorithm: Algorithm,
        *,
        env: str,
        tasks: Iterable[RolloutTask | dict[str, Any]],
        groups_per_step: int,
        group_size: int,
        params: SamplingParams | None = None,
        mode: Literal["sync", "async"] = "sync",
        max_staleness: int = 1,
        staleness_bound: Literal["trained", "started"] = "trained",
        oversample: float = 1.0,
        epochs: int = 1,
        adam: AdamParams | None = None,
        **rollout_options: Any,
    ) -> None:
        super().__init__(
            AsyncPipeline(
                job._target,
                algorithm,
                env=env,
                tasks=tasks,
                groups_per_step=groups_per_step,
                group_size=group_size,
                params=params,
                mode=mode,
                max_staleness=max_staleness,
                staleness_bound=staleness_bound,
                oversample=oversample,
                epochs=epochs,
                adam=adam,
                **rollout_options,
            ),
            job._runner,
        )

    def run(self, steps: int) -> Iterator[StepResult]:
        """Train `steps` steps (fewer if the tasks run out); one result per step."""
        return self._runner.iterate(self._target.run(steps))


async def _make_client(
    url: str, api_key: str, transport: httpx2.AsyncBaseTransport | None
) -> AsyncLoomClient:
    return AsyncLoomClient(url, api_key, transport=transport)
