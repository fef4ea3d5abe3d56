"""`JobClient`: the blocking face of `AsyncJobClient` (see `agents.sdk.sync`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agents.sdk._runner import BlockingFace
from agents.sdk.job import AsyncJobClient
from agents.sdk.sync_handles import CaptureSession, Future, RolloutStream, SandboxSession, Task
from gateway.schemas import Job, JobStatus, LoggedSample, MetricSeries, SampleRecord
from modelstate.schemas import Alias, Lineage, ManifestDiff, Retention, Version
from services.reward.schemas import RewardFunction
from services.rollout.schemas import RolloutTask, SampleResponse, SamplingParams, VersionRef
from services.trainer.schemas import (
    AdamParams,
    Datum,
    ForwardBackwardResult,
    ForwardResult,
    LossConfig,
    ModelInfo,
    OptimStepResult,
    SaveWeightsResult,
    StateCheckpoint,
)
from services.worker.schemas import TaskKind
from services.worker.task_schemas import BackgroundTask


class JobClient(BlockingFace[AsyncJobClient]):
    """A client of one training job, blocking: trainer calls return a `Future` at once
    (`.result()` waits). `with loom.create_job(...) as job:` ends the job with the block:
    completed, or failed (cancelled on Ctrl-C) when it raises."""

    @property
    def id(self) -> str:
        return self._target.id

    @property
    def info(self) -> Job:
        """The job's record, as last fetched."""
        return self._target.info

    # --- job record ------------------------------------------------------------------------

    def set_status(self, status: JobStatus | str) -> Job:
        """Move the job (running, paused, completed, failed, cancelled); see the state machine."""
        return self._runner.run(self._target.set_status(status))

    def finish(self, error: BaseException | None = None) -> Job:
        """End the job: `completed`, or `failed` for an `error` (`cancelled` when the script
        was interrupted)."""
        return self._runner.run(self._target.finish(error))

    def __enter__(self) -> JobClient:
        return self

    def __exit__(self, _type: object, error: BaseException | None, _tb: object) -> None:
        self._runner.run(self._target.__aexit__(_type, error, _tb))

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """`{"reward": 0.4, "loss": 1.2}` at `step`; sending a step again replaces it."""
        self._runner.run(self._target.log_metrics(step, metrics))

    def metrics(
        self, names: Sequence[str] = (), *, since_step: int | None = None
    ) -> dict[str, MetricSeries]:
        """Every metric of the job (or the `names` asked for) by name, steps ascending, after
        `since_step` when given."""
        return self._runner.run(self._target.metrics(names, since_step=since_step))

    def log_samples(self, samples: Sequence[SampleRecord | dict[str, Any]]) -> None:
        """Keep some trajectories (prompt, completion, reward, version) for inspection."""
        self._runner.run(self._target.log_samples(samples))

    def samples(self, limit: int = 50) -> list[LoggedSample]:
        """The samples logged last, at most `limit`."""
        return self._runner.run(self._target.samples(limit))

    # --- rollout ---------------------------------------------------------------------------

    def sample(
        self,
        prompt: str | Sequence[int],
        *,
        n: int = 1,
        params: SamplingParams | None = None,
        version: VersionRef = "latest",
    ) -> SampleResponse:
        """`n` completions of a prompt (text or token ids) by the job's `version`."""
        return self._runner.run(self._target.sample(prompt, n=n, params=params, version=version))

    def sample_many(
        self,
        prompts: Sequence[str | Sequence[int]],
        *,
        n: int = 1,
        params: SamplingParams | None = None,
        version: VersionRef = "latest",
    ) -> list[SampleResponse]:
        """Every prompt sampled by one version, in one request (the engine batches them);
        results in order (see `AsyncJobClient.sample_many` for seeds)."""
        return self._runner.run(
            self._target.sample_many(prompts, n=n, params=params, version=version)
        )

    def rollouts(
        self,
        tasks: Sequence[RolloutTask | dict[str, Any]],
        *,
        env: str,
        group_size: int = 1,
        params: SamplingParams | None = None,
        version: VersionRef = "latest",
        **options: Any,
    ) -> RolloutStream:
        """Episodes of `env` on this job's weights, `group_size` per task, each group
        streamed with rewards as soon as it is complete; `options` are `RolloutRequest`'s
        other fields."""
        stream = self._runner.run(
            self._target.rollouts(
                tasks, env=env, group_size=group_size, params=params, version=version, **options
            )
        )
        return RolloutStream(stream, self._runner)

    def capture(
        self, *, version: VersionRef = "latest", metadata: dict[str, Any] | None = None
    ) -> CaptureSession:
        """Record a black-box agent pointed at `.openai_base_url`: every call is answered by
        this job's `version` and recorded with token ids and logprobs."""
        session = self._runner.run(self._target.capture(version=version, metadata=metadata))
        return CaptureSession(session, self._runner)

    # --- trainer ---------------------------------------------------------------------------

    def forward_backward(
        self,
        data: Sequence[Datum],
        loss: LossConfig | None = None,
        *,
        return_logprobs: bool = False,
    ) -> Future[ForwardBackwardResult]:
        """Queue a forward and backward pass accumulating gradients of `loss` on `data`."""
        return Future(
            self._runner.run(
                self._target.forward_backward(data, loss, return_logprobs=return_logprobs)
            ),
            self._runner,
        )

    def forward(
        self, data: Sequence[Datum], loss: LossConfig | None = None
    ) -> Future[ForwardResult]:
        """Per-token logprobs of `data` under the trainer's current weights, and `loss`'s
        value if given (no gradient)."""
        return Future(self._runner.run(self._target.forward(data, loss)), self._runner)

    def reset_optimizer(self) -> Future[ModelInfo]:
        """A new phase (RL after SFT): AdamW's moments and unapplied gradients are dropped."""
        return Future(self._runner.run(self._target.reset_optimizer()), self._runner)

    def optim_step(self, adam: AdamParams | None = None) -> Future[OptimStepResult]:
        """Queue an AdamW step with the gradients accumulated so far."""
        return Future(self._runner.run(self._target.optim_step(adam)), self._runner)

    def save_weights(
        self, *, aliases: Sequence[str] = (), metrics: dict[str, float] | None = None
    ) -> Future[SaveWeightsResult]:
        """Queue publishing the trainer's weights as the job's next version."""
        return Future(
            self._runner.run(self._target.save_weights(aliases=aliases, metrics=metrics)),
            self._runner,
        )

    def model_info(self) -> ModelInfo:
        """The trainer's model of this job (NotFound after a trainer restart lost it)."""
        return self._runner.run(self._target.model_info())

    def ensure_model(self) -> ModelInfo:
        """Have the trainer hold this job's model again after it restarted (a no-op when it
        still does); then `load_state` a checkpoint to resume."""
        return self._runner.run(self._target.ensure_model())

    def save_state(self, name: str, *, series: str | None = None) -> Future[StateCheckpoint]:
        """Queue a checkpoint of weights, optimizer moments and step; resume with
        `load_state`."""
        return Future(self._runner.run(self._target.save_state(name, series=series)), self._runner)

    def load_state(self, name: str) -> Future[StateCheckpoint]:
        """Queue loading the checkpoint `name` into the trainer's model."""
        return Future(self._runner.run(self._target.load_state(name)), self._runner)

    def checkpoints(self) -> list[StateCheckpoint]:
        """The job's state checkpoints."""
        return self._runner.run(self._target.checkpoints())

    def delete_checkpoint(self, name: str) -> StateCheckpoint:
        """Delete the state checkpoint `name`."""
        return self._runner.run(self._target.delete_checkpoint(name))

    # --- background tasks ------------------------------------------------------------------

    def submit_task(
        self,
        kind: TaskKind | str,
        params: BaseModel | dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Task:
        """Queue `gc`, `evaluate` or `export` on Loom's worker; returns at once
        (`.result()` waits). The same `idempotency_key` again returns the same task."""
        task = self._runner.run(
            self._target.submit_task(kind, params, idempotency_key=idempotency_key)
        )
        return Task(task, self._runner)

    def run_recipe(
        self,
        recipe: str,
        config: BaseModel | dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Task:
        """A managed run of `recipe` (see `agents.recipes`) on this job by Loom's worker;
        returns at once."""
        task = self._runner.run(
            self._target.run_recipe(recipe, config, idempotency_key=idempotency_key)
        )
        return Task(task, self._runner)

    def tasks(self) -> list[BackgroundTask]:
        """This job's background tasks, newest first."""
        return self._runner.run(self._target.tasks())

    # --- model state -----------------------------------------------------------------------

    def versions(self) -> list[Version]:
        """The job's published versions."""
        return self._runner.run(self._target.versions())

    def version(self, ref: VersionRef = "latest") -> Version:
        """One version, by number or alias."""
        return self._runner.run(self._target.version(ref))

    def lineage(self, ref: VersionRef = "latest") -> Lineage:
        """The version `ref` and its ancestors, newest first."""
        return self._runner.run(self._target.lineage(ref))

    def compare(self, a: VersionRef, b: VersionRef = "latest") -> ManifestDiff:
        """The files added, removed and changed from version `a` to `b`."""
        return self._runner.run(self._target.compare(a, b))

    def move_alias(self, name: str, number: int) -> Alias:
        """Point the alias `name` at version `number`."""
        return self._runner.run(self._target.move_alias(name, number))

    def delete_version(self, number: int) -> Version:
        """Refused (Conflict) while an alias points at it or a rollout engine serves it."""
        return self._runner.run(self._target.delete_version(number))

    def open_sandbox(self, image: str | None = None) -> SandboxSession:
        """A sandbox session counted against this job's session limit."""
        return SandboxSession(self._runner.run(self._target.open_sandbox(image)), self._runner)

    def register_reward(self, name: str, code: str) -> RewardFunction:
        """A reward function of this job's; score with
        `score("python", items, {"function": name, "job_id": job.id})`."""
        return self._runner.run(self._target.register_reward(name, code))

    def retention(self) -> Retention:
        """Which of this job's versions garbage collection keeps (a default until set)."""
        return self._runner.run(self._target.retention())

    def set_retention(self, keep_last: int, *, keep_ancestors: bool = False) -> Retention:
        """Keep the newest `keep_last` versions (0: all), and every ancestor of an aliased
        version with `keep_ancestors`; aliased and pinned versions are always kept."""
        return self._runner.run(
            self._target.set_retention(keep_last, keep_ancestors=keep_ancestors)
        )

    def download(
        self, dest: str | Path, ref: VersionRef = "latest", *, merge_lora: bool = False
    ) -> Path:
        """The version as a Hugging Face directory `dest` (a LoRA version merged into its
        base model with `merge_lora`)."""
        return self._runner.run(self._target.download(dest, ref, merge_lora=merge_lora))
