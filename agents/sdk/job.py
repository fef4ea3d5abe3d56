"""A training job in the SDK's async core: its trainer model, weight versions, sampling,
logs, background tasks and managed runs."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from agents.sdk._futures import OperationFuture
from agents.sdk.capture import AsyncCaptureSession
from agents.sdk.rollouts import AsyncRolloutStream
from agents.sdk.sandbox import AsyncSandboxSession
from agents.sdk.tasks import AsyncTask, list_tasks
from gateway.schemas import (
    Job,
    JobMetrics,
    JobSamples,
    JobStatus,
    JobStatusUpdate,
    LoggedSample,
    MetricSeries,
    MetricsLog,
    SampleRecord,
    SamplesLog,
)
from modelstate.client import ARCHIVE
from modelstate.schemas import (
    Alias,
    Lineage,
    ManifestDiff,
    Retention,
    RetentionPolicy,
    Version,
)
from modelstate.transfer import unpack_archive
from services.common.schemas import MetricPoint
from services.reward.schemas import (
    RewardFunction,
)
from services.rollout.schemas import (
    RolloutRequest,
    RolloutTask,
    SampleBatchRequest,
    SampleBatchResponse,
    SampleRequest,
    SampleResponse,
    SamplingParams,
    VersionRef,
    batch_prompts_limit,
)
from services.trainer.schemas import (
    AdamParams,
    Datum,
    ForwardBackwardRequest,
    ForwardBackwardResult,
    ForwardRequest,
    ForwardResult,
    LoadStateRequest,
    LossConfig,
    ModelInfo,
    OptimStepRequest,
    OptimStepResult,
    SaveStateRequest,
    SaveWeightsRequest,
    SaveWeightsResult,
    StateCheckpoint,
)
from services.worker.schemas import TaskKind
from services.worker.task_schemas import BackgroundTask

if TYPE_CHECKING:
    from agents.sdk.client import AsyncLoomClient

log = logging.getLogger(__name__)


class AsyncJobClient:
    """A client of one training job: its trainer model, its weight versions, sampling from
    them (`info` is the job's record, as last fetched)."""

    info: Job

    def __init__(self, client: AsyncLoomClient, job: Job) -> None:
        self._client = client
        self._http = client._http
        self.info = job

    @property
    def id(self) -> str:
        return self.info.id

    # --- job record ------------------------------------------------------------------------

    async def set_status(self, status: JobStatus | str) -> Job:
        """Move the job (running, paused, completed, failed, cancelled); see the state machine."""
        body = await self._http.post_json(
            f"/v1/jobs/{self.id}/status", JobStatusUpdate(status=JobStatus(status)).model_dump()
        )
        self.info = Job.model_validate(body)
        return self.info

    async def finish(self, error: BaseException | None = None) -> Job:
        """End the job: `completed`, or `failed` for an `error` (`cancelled` when the script
        was interrupted), so the admin and `loom status` stop showing it as running."""
        if error is None:
            return await self.set_status(JobStatus.completed)
        interrupted = isinstance(error, KeyboardInterrupt | asyncio.CancelledError)
        return await self.set_status(JobStatus.cancelled if interrupted else JobStatus.failed)

    async def __aenter__(self) -> AsyncJobClient:
        return self

    async def __aexit__(self, _type: object, error: BaseException | None, _tb: object) -> None:
        """`async with await loom.create_job(...) as job:` ends the job with the block."""
        await _finish_after(self, error)

    async def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """`{"reward": 0.4, "loss": 1.2}` at `step`; the web admin plots them. Sending a step
        again replaces its values, so retrying is safe."""
        points = [MetricPoint(step=step, name=name, value=value) for name, value in metrics.items()]
        await self._http.post_json(
            f"/v1/jobs/{self.id}/metrics", MetricsLog(points=points).model_dump()
        )

    async def metrics(
        self, names: Sequence[str] = (), *, since_step: int | None = None
    ) -> dict[str, MetricSeries]:
        params: dict[str, Any] = {"name": list(names)}
        if since_step is not None:
            params["since_step"] = since_step
        body = await self._http.get_json(f"/v1/jobs/{self.id}/metrics", params=params)
        return {s.name: s for s in JobMetrics.model_validate(body).series}

    async def log_samples(self, samples: Sequence[SampleRecord | dict[str, Any]]) -> None:
        """Keep some trajectories (prompt, completion, reward, version) for inspection."""
        request = SamplesLog.model_validate({"samples": list(samples)})
        await self._http.post_json(f"/v1/jobs/{self.id}/samples", request.model_dump())

    async def samples(self, limit: int = 50) -> list[LoggedSample]:
        body = await self._http.get_json(f"/v1/jobs/{self.id}/samples", params={"limit": limit})
        return JobSamples.model_validate(body).samples

    # --- rollout ---------------------------------------------------------------------------

    async def sample(
        self,
        prompt: str | Sequence[int],
        *,
        n: int = 1,
        params: SamplingParams | None = None,
        version: VersionRef = "latest",
    ) -> SampleResponse:
        text, ids = (prompt, None) if isinstance(prompt, str) else (None, list(prompt))
        request = SampleRequest(
            job_id=self.id,
            version=version,
            prompt=text,
            prompt_token_ids=ids,
            n=n,
            params=params or SamplingParams(),
        )
        return await self._client.sample(request)

    async def sample_many(
        self,
        prompts: Sequence[str | Sequence[int]],
        *,
        n: int = 1,
        params: SamplingParams | None = None,
        version: VersionRef = "latest",
    ) -> list[SampleResponse]:
        """Sample every prompt, in as few requests as the service takes (up to
        `MAX_BATCH_PROMPTS` prompts, and `MAX_BATCH_SAMPLE_TOKENS` tokens to sample, each);
        the engine batches each request's prompts at once. Results in order.

        An alias such as "latest" is resolved once, so the whole batch uses one version. A
        seed (`params.seed`) gives each prompt a seed of its own, derived from it and the
        prompt's index: the same call again draws the same samples, and no two prompts share
        their noise."""
        base = params or SamplingParams()
        size = batch_prompts_limit(n, base.max_tokens)
        chunks = [
            [p if isinstance(p, str) else list(p) for p in prompts[i : i + size]]
            for i in range(0, len(prompts), size)
        ]
        if not chunks:
            return []

        async def batch(index: int, ref: VersionRef) -> SampleBatchResponse:
            # The service derives each prompt's seed from its index in the request: later
            # requests of a call start from a seed of their own, or they would repeat the
            # first's noise.
            request = SampleBatchRequest(
                job_id=self.id,
                version=ref,
                prompts=chunks[index],
                n=n,
                params=base.derived(index) if index else base,
            )
            return await self._client.sample_batch(request)

        first = await batch(0, version)
        rest = await asyncio.gather(*(batch(i, first.version) for i in range(1, len(chunks))))
        return [response for answer in (first, *rest) for response in answer.responses]

    async def rollouts(
        self,
        tasks: Sequence[RolloutTask | dict[str, Any]],
        *,
        env: str,
        group_size: int = 1,
        params: SamplingParams | None = None,
        version: VersionRef = "latest",
        **options: Any,
    ) -> AsyncRolloutStream:
        """Episodes of `env` on this job's weights, `group_size` per task, each group
        streamed with rewards as soon as it is complete. `options`: the other fields of
        `RolloutRequest` (env_params, version_refresh, max_turns, max_total_tokens,
        concurrency, schedule)."""
        request = RolloutRequest.model_validate(
            {
                "job_id": self.id,
                "env": env,
                "tasks": list(tasks),
                "group_size": group_size,
                "params": params or SamplingParams(),
                "version": version,
                **options,
            }
        )
        return await self._client.rollouts(request)

    async def capture(
        self, *, version: VersionRef = "latest", metadata: dict[str, Any] | None = None
    ) -> AsyncCaptureSession:
        """Record a black-box agent: point its OpenAI client at `.openai_base_url` (with
        `.api_key`); every call is answered by this job's `version` (an alias is resolved
        per call) and recorded with token ids and logprobs, whatever model name the agent
        uses. `.fetch()` gives the calls and the training segments."""
        return await self._client.capture(job_id=self.id, version=version, metadata=metadata)

    # --- trainer ---------------------------------------------------------------------------

    async def _submit(
        self, action: str, request: BaseModel | None, result_type: type
    ) -> OperationFuture[Any]:
        """Submitted under an idempotency key: a submission whose answer was lost is sent
        again and still runs once."""
        trainer = self._http.trainer
        return OperationFuture(trainer, await trainer.submit(action, self.id, request), result_type)

    async def forward_backward(
        self,
        data: Sequence[Datum],
        loss: LossConfig | None = None,
        *,
        return_logprobs: bool = False,
    ) -> OperationFuture[ForwardBackwardResult]:
        request = ForwardBackwardRequest(
            data=list(data), loss=loss or LossConfig(), return_logprobs=return_logprobs
        )
        return await self._submit("forward_backward", request, ForwardBackwardResult)

    async def forward(
        self, data: Sequence[Datum], loss: LossConfig | None = None
    ) -> OperationFuture[ForwardResult]:
        """Per-token logprobs of `data` under the trainer's current weights, and `loss`'s
        value if given (no gradient)."""
        request = ForwardRequest(data=list(data), loss=loss)
        return await self._submit("forward", request, ForwardResult)

    async def reset_optimizer(self) -> OperationFuture[ModelInfo]:
        """A new phase (RL after SFT): AdamW's moments and unapplied gradients are dropped,
        in order with the calls before and after it."""
        return await self._submit("reset_optimizer", None, ModelInfo)

    async def optim_step(self, adam: AdamParams | None = None) -> OperationFuture[OptimStepResult]:
        request = OptimStepRequest(adam=adam or AdamParams())
        return await self._submit("optim_step", request, OptimStepResult)

    async def save_weights(
        self, *, aliases: Sequence[str] = (), metrics: dict[str, float] | None = None
    ) -> OperationFuture[SaveWeightsResult]:
        request = SaveWeightsRequest(aliases=list(aliases), metrics=metrics or {})
        return await self._submit("save_weights", request, SaveWeightsResult)

    async def model_info(self) -> ModelInfo:
        """The trainer's model of this job (NotFound after a trainer restart lost it)."""
        return await self._http.trainer.get_model(self.id)

    async def ensure_model(self) -> ModelInfo:
        """Have the trainer hold this job's model again after it restarted (a no-op when it
        still does); then `load_state` a checkpoint to resume."""
        return ModelInfo.model_validate(await self._http.post_json(f"/v1/jobs/{self.id}/model"))

    async def save_state(
        self, name: str, *, series: str | None = None
    ) -> OperationFuture[StateCheckpoint]:
        """Checkpoint weights, optimizer moments and step (names are never reused); resume
        with `load_state`, also on a restarted trainer. A checkpoint of a `series` makes the
        series' older ones beyond the trainer's keep count go; others stay until deleted."""
        request = SaveStateRequest(name=name, series=series)
        return await self._submit("save_state", request, StateCheckpoint)

    async def load_state(self, name: str) -> OperationFuture[StateCheckpoint]:
        return await self._submit("load_state", LoadStateRequest(name=name), StateCheckpoint)

    async def checkpoints(self) -> list[StateCheckpoint]:
        return (await self._http.trainer.list_checkpoints(self.id)).checkpoints

    async def delete_checkpoint(self, name: str) -> StateCheckpoint:
        return await self._http.trainer.delete_checkpoint(self.id, name)

    # --- background tasks ------------------------------------------------------------------

    async def submit_task(
        self,
        kind: TaskKind | str,
        params: BaseModel | dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> AsyncTask:
        """Queue `gc`, `evaluate` or `export` (params: `GcParams`, `EvaluateParams`,
        `ExportParams` or their dicts) on Loom's worker; returns at once. `await
        task.result()` gives the report, evaluation or export directory. Submitting again
        with the same `idempotency_key` returns the same task."""
        return await AsyncTask.submit(self._http, self.id, kind, params, idempotency_key)

    async def run_recipe(
        self,
        recipe: str,
        config: BaseModel | dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> AsyncTask:
        """A managed run: Loom's worker runs `recipe` (see `agents.recipes`) on this job,
        checkpointing as it goes and resuming after a crash; returns at once. Stop it with
        `task.cancel()` or by cancelling the job; pause the job to hold it between steps."""
        if isinstance(config, BaseModel):
            config = config.model_dump(mode="json")
        return await self.submit_task(
            TaskKind.recipe,
            {"recipe": recipe, "config": config or {}},
            idempotency_key=idempotency_key,
        )

    async def tasks(self) -> list[BackgroundTask]:
        """This job's background tasks, newest first."""
        return await list_tasks(self._http, self.id)

    # --- model state -----------------------------------------------------------------------

    async def versions(self) -> list[Version]:
        return await self._http.modelstate.list_versions(self.id)

    async def version(self, ref: VersionRef = "latest") -> Version:
        return await self._http.modelstate.get_version(self.id, ref)

    async def lineage(self, ref: VersionRef = "latest") -> Lineage:
        return await self._http.modelstate.lineage(self.id, ref)

    async def compare(self, a: VersionRef, b: VersionRef = "latest") -> ManifestDiff:
        return await self._http.modelstate.compare(self.id, a, b)

    async def move_alias(self, name: str, number: int) -> Alias:
        return await self._http.modelstate.move_alias(self.id, name, number)

    async def delete_version(self, number: int) -> Version:
        """Refused (Conflict) while an alias points at it or a rollout engine serves it."""
        return await self._http.modelstate.delete_version(self.id, number)

    async def open_sandbox(self, image: str | None = None) -> AsyncSandboxSession:
        """A sandbox session counted against this job's session limit."""
        return await self._client.open_sandbox(job_id=self.id, image=image)

    async def register_reward(self, name: str, code: str) -> RewardFunction:
        """A reward function of this job's; score with
        `score("python", items, {"function": name, "job_id": job.id})`."""
        return await self._client.register_reward(name, code, job_id=self.id)

    async def retention(self) -> Retention:
        """Which of this job's versions garbage collection keeps (a default until set)."""
        return await self._http.modelstate.get_retention(self.id)

    async def set_retention(self, keep_last: int, *, keep_ancestors: bool = False) -> Retention:
        policy = RetentionPolicy(keep_last=keep_last, keep_ancestors=keep_ancestors)
        return await self._http.modelstate.set_retention(self.id, policy)

    async def download(
        self, dest: str | Path, ref: VersionRef = "latest", *, merge_lora: bool = False
    ) -> Path:
        """The version as a Hugging Face directory `dest` (a LoRA version merged into its base
        model with `merge_lora`): the tar is streamed to disk next to `dest`, then unpacked."""
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=dest.parent, suffix=".tar") as archive:
            response = await self._http.modelstate.open(
                ARCHIVE, params={"merge_lora": merge_lora}, job_id=self.id, ref=ref
            )
            try:
                async for chunk in response.aiter_bytes(1 << 20):
                    archive.write(chunk)
            finally:
                await response.aclose()
            archive.flush()
            await asyncio.to_thread(unpack_archive, Path(archive.name), dest)
        return dest

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.info.base_model} {self.info.mode.value}>"


async def _finish_after(job: AsyncJobClient, error: BaseException | None) -> None:
    """`job.finish(error)`; when the block raised, a failure to record that is logged, so the
    block's own error is the one the script sees."""
    if error is None:
        await job.finish()
        return
    try:
        await job.finish(error)
    except Exception:
        log.warning("job %s: could not record how it ended", job.id, exc_info=True)
