"""What a recipe gets: a client and its job (the sync SDK, through the gateway with a key
that acts for this job only), where to start, and `checkpoint`.

A checkpoint is three writes in an order that makes every crash resumable without
publishing a step twice:

1. `save_state` on the trainer (a new name per attempt: names are never reused);
2. record the progress (step, checkpoint, the recipe's state, what to publish);
3. `save_weights`, which publishes the step's version.

A crash before 2 resumes from the previous checkpoint and redoes the step under a new
checkpoint name; a crash after 2 restores the checkpoint and publishes again, which for a
version already published (same step, same files) returns that version instead of a second.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agents.sdk.sync import JobClient, LoomClient
from services.trainer.schemas import SaveWeightsResult
from services.worker.schemas import PublishOptions, RunProgress


class RecipeRun:
    def __init__(
        self,
        loom: LoomClient,
        job: JobClient,
        *,
        run_id: str,
        resumed: RunProgress | None,
        record: Callable[[RunProgress], None],
        between_steps: Callable[[], None],
        series: str | None = None,
    ) -> None:
        """`run_id` names this attempt's checkpoints; `series` groups the run's checkpoints
        across attempts, so the trainer keeps only its newest few."""
        self.loom = loom
        self.job = job
        self.run_id = run_id
        self.series = series
        self.last = resumed  # the newest checkpoint: the resumed one, then each new one
        self._record = record
        self._between_steps = between_steps

    @property
    def start_step(self) -> int:
        """The first step this attempt runs: 1, or the one after the resumed checkpoint."""
        return self.last.step + 1 if self.last else 1

    @property
    def state(self) -> dict[str, Any]:
        """The recipe's state saved with the newest checkpoint ({} at the start)."""
        return dict(self.last.state) if self.last else {}

    def restore(self) -> SaveWeightsResult | None:
        """Make the trainer hold the job's model (rebuilt after a trainer restart) and, when
        resuming, load the checkpoint and publish its step again (a no-op if it was)."""
        self.job.ensure_model()
        if self.last is None:
            return None
        self.job.load_state(self.last.checkpoint).result()
        return self._publish(self.last.publish)

    def checkpoint(
        self,
        step: int,
        state: dict[str, Any] | None = None,
        *,
        aliases: Sequence[str] = (),
        metrics: dict[str, float] | None = None,
    ) -> SaveWeightsResult:
        """Step `step` is done: save the trainer state, record it, publish the weights (with
        `aliases` moved to them), then stop here if the run was cancelled or wait here while
        its job is paused. Returns the published version."""
        if self.last is not None and step <= self.last.step:
            raise ValueError(f"checkpoint step {step} is not after step {self.last.step}")
        name = f"{self.run_id}-step-{step}"
        self.job.save_state(name, series=self.series).result()
        progress = RunProgress(
            step=step,
            checkpoint=name,
            state=state or {},
            publish=PublishOptions(aliases=list(aliases), metrics=metrics or {}),
        )
        self._record(progress)
        self.last = progress
        published = self._publish(progress.publish)
        self._between_steps()
        return published

    def _publish(self, options: PublishOptions) -> SaveWeightsResult:
        result: SaveWeightsResult = self.job.save_weights(
            aliases=options.aliases, metrics=options.metrics
        ).result()
        return result
