"""JSON bodies of the Tinker protocol (lenient: the SDK adds fields between versions)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field

from services.common.schemas import LenientModel


class CreateSession(LenientModel):
    tags: list[str] = []
    user_metadata: dict[str, Any] = {}


class Heartbeat(LenientModel):
    session_id: str


class LoraSpec(LenientModel):
    rank: int = 32
    seed: int | None = None


class CreateModel(LenientModel):
    session_id: str
    model_seq_id: int
    base_model: str
    lora_config: LoraSpec | None = None


class ModelRef(LenientModel):
    model_id: str


class AdamSpec(LenientModel):
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


class OptimStep(LenientModel):
    model_id: str
    seq_id: int
    adam_params: AdamSpec = AdamSpec()


# Tinker's own server takes 1 hour to 10 years; Loom takes any positive TTL.
TtlSeconds = Annotated[
    int | None,
    Field(
        default=None,
        ge=1,
        description="Seconds from now until the checkpoint expires; None: never.",
    ),
]


class SaveForSampler(LenientModel):
    model_id: str
    seq_id: int
    path: str | None = None
    sampling_session_seq_id: int | None = None
    ttl_seconds: TtlSeconds = None  # named sampler weights only


class SaveState(LenientModel):
    model_id: str
    seq_id: int
    path: str | None = None  # the checkpoint's name
    ttl_seconds: TtlSeconds = None
    overwrite: bool = False
    user_metadata: dict[str, str] | None = None


class LoadState(LenientModel):
    """Into a model (`model_id`, `seq_id`: load_state), or into a new one made for it
    (`session_id`, `model_seq_id`: create_training_client_from_state)."""

    path: str
    optimizer: bool
    model_id: str | None = None
    seq_id: int | None = None
    session_id: str | None = None
    model_seq_id: int | None = None
    base_model: str | None = None


class WeightsInfo(LenientModel):
    tinker_path: str


class CreateSamplingSession(LenientModel):
    session_id: str
    sampling_session_seq_id: int
    base_model: str | None = None
    model_path: str | None = None


class Chunk(LenientModel):
    type: str = "encoded_text"
    tokens: list[int] = []


class Prompt(LenientModel):
    chunks: list[Chunk]


class TinkerSamplingParams(LenientModel):
    max_tokens: int | None = None
    seed: int | None = None
    stop: str | list[str] | list[int] | None = None
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0


class Sample(LenientModel):
    sampling_session_id: str
    seq_id: int = 0
    num_samples: int = Field(default=1, ge=1)
    prompt: Prompt
    sampling_params: TinkerSamplingParams = TinkerSamplingParams()
    prompt_logprobs: bool | None = False
    prompt_logprobs_last_n: int | None = Field(default=None, ge=1)
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0


class RetrieveFuture(LenientModel):
    request_id: str


class Unsupported(LenientModel):
    """Any body of a call Loom does not serve yet."""


# --- responses of the GET calls (the SDK's own types, field for field) ----------------------


class SupportedModel(LenientModel):
    model_name: str
    max_context_length: int | None = None  # not known to the gateway
    trainable: bool
    sampleable: bool


class ServerCapabilities(LenientModel):
    supported_models: list[SupportedModel]


class Checkpoint(LenientModel):
    checkpoint_id: str  # "weights/<name>" or "sampler_weights/<name>"
    checkpoint_type: Literal["training", "sampler"]
    time: datetime
    tinker_path: str
    size_bytes: int | None = None
    public: bool = False
    user_metadata: dict[str, str] | None = None
    expires_at: datetime | None = None


class Cursor(LenientModel):
    offset: int
    limit: int
    total_count: int


class CheckpointsList(LenientModel):
    checkpoints: list[Checkpoint]
    cursor: Cursor | None = None  # None: one run's checkpoints, all of them


class TrainingRun(LenientModel):
    training_run_id: str
    base_model: str
    model_owner: str  # the API key's name
    is_lora: bool = True
    corrupted: bool = False  # its job failed
    lora_rank: int | None = None
    last_request_time: datetime  # Loom's latest record of it: creation or newest checkpoint
    last_checkpoint: Checkpoint | None = None
    last_sampler_checkpoint: Checkpoint | None = None
    user_metadata: dict[str, str] | None = None


class TrainingRuns(LenientModel):
    training_runs: list[TrainingRun]
    cursor: Cursor


class SessionInfo(LenientModel):
    training_run_ids: list[str]
    sampler_ids: list[str]
    user_metadata: dict[str, str] | None = None
    display_name: str | None = None


class Sessions(LenientModel):
    sessions: list[str]


class CheckpointTtl(LenientModel):
    ttl_seconds: TtlSeconds = None


# --- responses of the calls the SDK makes (its types' fields, as Loom fills them) ----------


class ClientConfig(LenientModel):
    pjwt_auth_enabled: bool = False
    use_pyqwest_transport: bool = False


class DynamicConfig(LenientModel):
    refresh_interval_sec: int


class Status(LenientModel):
    status: str


class SessionCreated(LenientModel):
    type: Literal["create_session"] = "create_session"
    session_id: str


class HeartbeatDone(LenientModel):
    type: Literal["session_heartbeat"] = "session_heartbeat"


class Future(LenientModel):
    """A call that answers later: its result is read with retrieve_future."""

    request_id: str
    model_id: str | None = None  # create_model and create_training_client_from_state only


class SampleFuture(LenientModel):
    request_id: str
    sample_sequence_ids: list[str]


class ModelData(LenientModel):
    model_name: str
    arch: str | None = None
    tokenizer_id: str


class ModelInfo(LenientModel):
    type: Literal["get_info"] = "get_info"
    model_id: str
    is_lora: bool = True
    lora_rank: int
    model_name: str
    model_data: ModelData


class WeightsInfoResponse(LenientModel):
    base_model: str
    is_lora: bool = True
    lora_rank: int


class SamplingSessionCreated(LenientModel):
    sampling_session_id: str
    type: Literal["create_sampling_session"] = "create_sampling_session"


class SamplerInfo(LenientModel):
    sampler_id: str
    base_model: str
    model_path: str | None
