"""Loom's Python SDK: RL scripts talk to Loom only through these REST clients.

from agents.sdk import LoomClient
loom = LoomClient("http://127.0.0.1:8000", api_key)
job = loom.create_job("loom/tiny", mode="lora")      # a JobClient
out = job.sample("2+3=", n=4)
job.forward_backward(data, LossConfig(name="ppo")).result()
"""

import warnings
from typing import Any

from agents.sdk._futures import OperationFuture
from agents.sdk.capture import AsyncCaptureSession
from agents.sdk.client import AsyncLoomClient
from agents.sdk.job import AsyncJobClient
from agents.sdk.pipeline import AsyncPipeline, StepResult
from agents.sdk.rollouts import AsyncRolloutStream
from agents.sdk.sandbox import AsyncSandboxSession
from agents.sdk.sync import (
    CaptureSession,
    Future,
    JobClient,
    LoomClient,
    Pipeline,
    RolloutStream,
    SandboxSession,
    Task,
)
from agents.sdk.tasks import AsyncTask
from modelstate.schemas import Version
from services.common.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    InvalidInput,
    LimitExceeded,
    LoomError,
    NotFound,
    Unauthorized,
    Unavailable,
    UpstreamError,
)
from services.reward.schemas import ScoreItem, ScoreRequest
from services.rollout.schemas import (
    CapturedSegment,
    CapturedTrajectory,
    ChatMessage,
    RolloutGroup,
    RolloutTask,
    SampleResponse,
    SamplingParams,
    Trajectory,
)
from services.trainer.schemas import AdamParams, Datum, LoraConfig, LossConfig, TrainingMode
from services.worker.task_schemas import BackgroundTask

__all__ = [
    "AdamParams",
    "AsyncCaptureSession",
    "AsyncJobClient",
    "AsyncLoomClient",
    "AsyncPipeline",
    "AsyncRolloutStream",
    "AsyncSandboxSession",
    "AsyncTask",
    "BackgroundTask",
    "BadRequest",
    "CaptureSession",
    "CapturedSegment",
    "CapturedTrajectory",
    "ChatMessage",
    "Conflict",
    "Datum",
    "Forbidden",
    "Future",
    "InvalidInput",
    "JobClient",
    "LimitExceeded",
    "LoomClient",
    "LoomError",
    "LoraConfig",
    "LossConfig",
    "NotFound",
    "OperationFuture",
    "Pipeline",
    "RolloutGroup",
    "RolloutStream",
    "RolloutTask",
    "SampleResponse",
    "SandboxSession",
    "SamplingParams",
    "ScoreItem",
    "ScoreRequest",
    "StepResult",
    "Task",
    "Trajectory",
    "TrainingMode",
    "Unauthorized",
    "Unavailable",
    "UpstreamError",
    "Version",
]


def __getattr__(name: str) -> Any:
    # `Job` was JobClient's name until it was mistaken for the gateway's job record
    # (gateway.schemas.Job, what `JobClient.info` holds); scripts that use it keep working.
    if name == "Job":
        warnings.warn(
            "agents.sdk.Job is now agents.sdk.JobClient", DeprecationWarning, stacklevel=2
        )
        return JobClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
