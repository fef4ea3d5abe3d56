"""Blocking views of the async core's handles: operation futures, background tasks, sandbox
sessions, rollout streams and capture sessions (see `agents.sdk.sync`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from agents.sdk._futures import OperationFuture
from agents.sdk._runner import BlockingFace
from agents.sdk.capture import AsyncCaptureSession
from agents.sdk.rollouts import AsyncRolloutStream
from agents.sdk.sandbox import AsyncSandboxSession
from agents.sdk.tasks import AsyncTask
from services.common.schemas import ErrorBody, Operation
from services.rollout.schemas import (
    CapturedTrajectory,
    RolloutEvent,
    RolloutGroup,
    RolloutSummary,
    TrajectoryInfo,
)
from services.sandbox.schemas import ExecuteResponse, SessionInfo
from services.worker.task_schemas import BackgroundTask

T = TypeVar("T", bound=BaseModel)


class Future(BlockingFace[OperationFuture[T]], Generic[T]):
    """A trainer operation queued by `JobClient`: `.result()` blocks until it is done."""

    @property
    def id(self) -> str:
        return self._target.id

    @property
    def operation(self) -> Operation:
        """The operation as last polled."""
        return self._target.operation

    def result(self, timeout: float | None = None) -> T:
        """The operation's result once done; its error, typed, if it failed (TimeoutError
        after `timeout` s)."""
        return self._runner.run(self._target.result(timeout))


class Task(BlockingFace[AsyncTask]):
    """A background task on Loom's worker: `job.submit_task("export").result()` waits for it."""

    @property
    def id(self) -> str:
        return self._target.id

    @property
    def info(self) -> BackgroundTask:
        """The task as last fetched."""
        return self._target.info

    def refresh(self) -> BackgroundTask:
        """The task as it is now."""
        return self._runner.run(self._target.refresh())

    def wait(self, timeout: float | None = None) -> BackgroundTask:
        """The task once succeeded, failed or cancelled (TimeoutError after `timeout` s)."""
        return self._runner.run(self._target.wait(timeout))

    def result(self, timeout: float | None = None) -> BaseModel:
        """What the task produced (GcReport, EvaluateResult, ExportResult); its error, typed,
        if it failed."""
        return self._runner.run(self._target.result(timeout))

    def cancel(self) -> BackgroundTask:
        """Cancel the task."""
        return self._runner.run(self._target.cancel())

    def retry(self) -> BackgroundTask:
        """Queue a failed task again."""
        return self._runner.run(self._target.retry())


class SandboxSession(BlockingFace[AsyncSandboxSession]):
    """A sandbox whose files persist between programs; a `with` block closes it."""

    @property
    def id(self) -> str:
        return self._target.id

    @property
    def info(self) -> SessionInfo:
        return self._target.info

    def execute(self, code: str, **options: Any) -> ExecuteResponse:
        """Run a program (same options as `LoomClient.execute`); files stay, processes do
        not."""
        return self._runner.run(self._target.execute(code, **options))

    def write_files(self, files: Mapping[str, str | bytes]) -> None:
        """Write files (text or bytes) into the session's workdir."""
        self._runner.run(self._target.write_files(files))

    def read_files(self, paths: Sequence[str]) -> dict[str, bytes]:
        """The files' bytes; a file that cannot be returned raises with the reason."""
        return self._runner.run(self._target.read_files(paths))

    def close(self) -> None:
        """Close the session on the sandbox service."""
        self._runner.run(self._target.close())

    def __enter__(self) -> SandboxSession:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class RolloutStream(BlockingFace[AsyncRolloutStream]):
    """Rollout groups as the service completes them: iterate for the groups."""

    @property
    def errors(self) -> list[ErrorBody]:
        """The groups that failed so far (their task_index in `detail`)."""
        return self._target.errors

    @property
    def summary(self) -> RolloutSummary | None:
        """The request's summary, after the last group."""
        return self._target.summary

    def __iter__(self) -> Iterator[RolloutGroup]:
        return self._runner.iterate(aiter(self._target))

    def events(self) -> Iterator[RolloutEvent]:
        """Every event as it arrives: groups, errors, the summary."""
        return self._runner.iterate(self._target.events())

    def collect(self) -> list[RolloutGroup]:
        """Every group, in the order they completed."""
        return self._runner.run(self._target.collect())

    def close(self) -> None:
        """Stop early: the service cancels the groups still running."""
        self._runner.run(self._target.aclose())


class CaptureSession(BlockingFace[AsyncCaptureSession]):
    """A trajectory a black-box agent's OpenAI calls are recorded into."""

    @property
    def id(self) -> str:
        return self._target.id

    @property
    def api_key(self) -> str:
        """The key the agent's OpenAI client sends."""
        return self._target.api_key

    @property
    def info(self) -> TrajectoryInfo:
        return self._target.info

    @property
    def openai_base_url(self) -> str:
        """What an OpenAI client's `base_url` is set to: it appends `/chat/completions`."""
        return self._target.openai_base_url

    def fetch(self) -> CapturedTrajectory:
        """The calls recorded so far and their training segments."""
        return self._runner.run(self._target.fetch())

    def delete(self) -> None:
        """Delete the trajectory."""
        self._runner.run(self._target.delete())
