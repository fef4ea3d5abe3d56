"""Loom's Python SDK: RL scripts talk to Loom only through these REST clients.

    from agents.sdk import LoomClient
    loom = LoomClient("http://127.0.0.1:8000", api_key)
    job = loom.create_job("loom/tiny", mode="lora")
    out = job.sample("2+3=", n=4)
    job.forward_backward(data, LossConfig(name="ppo")).result()
"""

from agents.sdk._futures import OperationFuture
from agents.sdk.capture import AsyncCaptureSession
from agents.sdk.client import AsyncLoomClient
from agents.sdk.job import AsyncJob
from agents.sdk.pipeline import AsyncPipeline, StepResult
from agents.sdk.rollouts import AsyncRolloutStream
from agents.sdk.sandbox import AsyncSandboxSession
from agents.sdk.sync import (
    CaptureSession,
    Future,
    Job,
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
    "AsyncJob",
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
    "Job",
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
