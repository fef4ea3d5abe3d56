"""The async core of the SDK: everything an RL script does, as REST calls to the gateway."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx2

from agents.sdk._http import GatewayHttp
from agents.sdk.capture import AsyncCaptureSession
from agents.sdk.job import AsyncJobClient
from agents.sdk.rollouts import AsyncRolloutStream
from agents.sdk.sandbox import AsyncSandboxSession
from agents.sdk.tasks import AsyncTask
from gateway.schemas import (
    Job,
    JobCreate,
    StackHealth,
)
from services.reward.schemas import (
    RewardFunction,
    RewardFunctionPut,
    ScoreBatchRequest,
    ScoreBatchResponse,
    ScoreItem,
    ScoreRequest,
    ScoreResponse,
)
from services.rollout.schemas import (
    ChatMessage,
    RenderRequest,
    RenderResponse,
    RolloutRequest,
    SampleBatchRequest,
    SampleBatchResponse,
    SampleRequest,
    SampleResponse,
    TokenizeRequest,
    TrajectoryCreate,
    VersionRef,
)
from services.sandbox.schemas import ExecuteRequest, ExecuteResponse, SessionCreate
from services.trainer.schemas import (
    LoraConfig,
    TrainingMode,
)
from services.worker.task_schemas import BackgroundTask

# The most texts one tokenize request may carry (TokenizeRequest's limit).
TOKENIZE_BATCH = 4096


class AsyncLoomClient:
    """Entry point: `AsyncLoomClient(url, api_key)`; `transport` lets tests run in-process."""

    def __init__(
        self, url: str, api_key: str, *, transport: httpx2.AsyncBaseTransport | None = None
    ) -> None:
        self._http = GatewayHttp(url, api_key, transport=transport)
        self._api_key = api_key

    async def health(self) -> StackHealth:
        return StackHealth.model_validate(await self._http.get_json("/v1/health"))

    async def create_job(
        self,
        base_model: str,
        *,
        name: str = "job",
        mode: TrainingMode | str = TrainingMode.lora,
        lora: LoraConfig | None = None,
        config: dict[str, Any] | None = None,
    ) -> AsyncJobClient:
        request = JobCreate(
            name=name,
            base_model=base_model,
            mode=TrainingMode(mode),
            lora=lora or LoraConfig(),
            config=config or {},
        )
        body = await self._http.post_json("/v1/jobs", request.model_dump(mode="json"))
        return AsyncJobClient(self, Job.model_validate(body))

    async def get_task(self, task_id: str) -> AsyncTask:
        """A background task by id (see `AsyncJobClient.submit_task`)."""
        body = await self._http.get_json(f"/v1/tasks/{task_id}")
        return AsyncTask(self._http, BackgroundTask.model_validate(body))

    async def get_job(self, job_id: str) -> AsyncJobClient:
        body = await self._http.get_json(f"/v1/jobs/{job_id}")
        return AsyncJobClient(self, Job.model_validate(body))

    async def sample(self, request: SampleRequest) -> SampleResponse:
        return await self._http.rollout.sample(request)

    async def sample_batch(self, request: SampleBatchRequest) -> SampleBatchResponse:
        """Many prompts on one version in one request (see `AsyncJobClient.sample_many`)."""
        return await self._http.rollout.sample_batch(request)

    async def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text (with the rollout engine's tokenizer), any number of texts."""
        token_ids: list[list[int]] = []
        for start in range(0, len(texts), TOKENIZE_BATCH):
            request = TokenizeRequest(texts=list(texts[start : start + TOKENIZE_BATCH]))
            token_ids.extend((await self._http.rollout.tokenize(request)).token_ids)
        return token_ids

    async def rollouts(self, request: RolloutRequest) -> AsyncRolloutStream:
        """Trajectories of an environment, streamed a group at a time (see `AsyncJobClient`)."""
        return await AsyncRolloutStream.open(self._http, request)

    async def render(
        self, messages: Sequence[ChatMessage | dict[str, str]], tools: Sequence[dict[str, Any]] = ()
    ) -> RenderResponse:
        """A conversation as training tokens with the model's chat template: loss mask 1 on
        the assistant's turns, exactly as a rollout of it would be tokenised."""
        request = RenderRequest.model_validate({"messages": list(messages), "tools": list(tools)})
        return await self._http.rollout.render(request)

    async def capture(
        self,
        *,
        job_id: str | None = None,
        version: VersionRef = "latest",
        metadata: dict[str, Any] | None = None,
    ) -> AsyncCaptureSession:
        """A trajectory an OpenAI-speaking agent's calls are recorded into (see
        `AsyncJobClient.capture`)."""
        request = TrajectoryCreate(job_id=job_id, version=version, metadata=metadata or {})
        return await AsyncCaptureSession.create(self._http, self._api_key, request)

    async def score(
        self, verifier: str, items: Sequence[ScoreItem], params: dict[str, Any] | None = None
    ) -> ScoreResponse:
        request = ScoreRequest(verifier=verifier, items=list(items), params=params or {})
        return await self._http.reward.score(request)

    async def score_batches(self, batches: Sequence[ScoreRequest]) -> ScoreBatchResponse:
        """Several batches, each with its own verifier and params, in one request (e.g. every
        group of a step): `results[i]` scores `batches[i]`, or holds the error that stopped
        it (an unknown verifier, bad params) while the others are scored."""
        return await self._http.reward.score_batch(ScoreBatchRequest(batches=list(batches)))

    async def execute(self, code: str, **options: Any) -> ExecuteResponse:
        return await self._http.sandbox.execute(ExecuteRequest(code=code, **options))

    async def open_sandbox(
        self, *, job_id: str | None = None, image: str | None = None
    ) -> AsyncSandboxSession:
        """A sandbox session: files persist between programs (multi-turn tools)."""
        info = await self._http.sandbox.create_session(SessionCreate(job_id=job_id, image=image))
        return AsyncSandboxSession(self._http, info)

    async def register_reward(
        self, name: str, code: str, job_id: str | None = None
    ) -> RewardFunction:
        """Register (or replace) a reward function for the `python` verifier; it runs in the
        sandbox, never in the reward service."""
        return await self._http.reward.put_function(
            name, RewardFunctionPut(code=code, job_id=job_id)
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncLoomClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()
