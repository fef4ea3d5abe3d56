"""Request bodies of the Weaver protocol as the SDK sends them, and the responses of its listing
calls. Fields Loom does not use are ignored (the SDK adds new optional fields release by
release); the ones it uses are checked."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class WeaverBody(BaseModel):
    model_config = ConfigDict(extra="ignore")


class CreateSession(WeaverBody):
    name: str | None = Field(default=None, max_length=256)
    tags: list[str] = []
    labels: dict[str, str] = {}
    user_metadata: dict[str, Any] = {}


class LoraSpec(WeaverBody):
    rank: int = Field(default=32, ge=1, le=1024)
    seed: int | None = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class CreateModel(WeaverBody):
    model_seq_id: int = Field(ge=0)
    base_model: str = Field(min_length=1, max_length=1024)
    training_mode: Literal["lora", "full_ft"] = "lora"
    lora_config: LoraSpec = LoraSpec()
    user_metadata: dict[str, Any] | None = None


class MetricSpec(WeaverBody):
    model_id: str
    name: str
    value: float
    step: int


class LogMetrics(WeaverBody):
    metrics: list[MetricSpec] = Field(min_length=1, max_length=1000)


class Chunk(WeaverBody):
    type: str = "encoded_text"
    tokens: list[int] = Field(default=[], max_length=131072)


class ModelInput(WeaverBody):
    chunks: list[Chunk] = Field(max_length=1024)

    def tokens(self) -> list[int]:
        return [token for chunk in self.chunks for token in chunk.tokens]


class TensorData(WeaverBody):
    data: list[Any]
    dtype: str = "float32"


class Datum(WeaverBody):
    model_input: ModelInput | None = None
    loss_fn_inputs: dict[str, TensorData | list[Any]] = {}
    datum_id: str | None = None
    kind: str = "token"


class PassInput(WeaverBody):
    loss_fn: str
    data: list[Datum] = Field(min_length=1, max_length=4096)
    loss_fn_config: dict[str, Any] | None = None


class PassPayload(WeaverBody):
    model_id: str
    seq_id: int = Field(ge=1)
    tensor_transport: str = "default"
    forward_input: PassInput | None = None
    forward_backward_input: PassInput | None = None


class PassBody(WeaverBody):
    payload: PassPayload


class AdamSpec(WeaverBody):
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 1e-2
    grad_clip_norm: float = 1.0


class OptimPayload(WeaverBody):
    model_id: str
    seq_id: int = Field(ge=1)
    adam_params: AdamSpec = AdamSpec()


class OptimBody(WeaverBody):
    payload: OptimPayload


class ExportSampler(WeaverBody):
    seq_id: int = Field(ge=1)
    path: str | None = None
    ttl_seconds: int | None = Field(default=None, ge=1)  # named exports: forgotten after it


class SaveCheckpoint(WeaverBody):
    type: Literal["weight", "weight_and_optimizer", "sampling"] = "weight"
    name: str | None = None
    ttl_seconds: int | None = Field(default=None, ge=1)  # None: kept until deleted


class LoadCheckpoint(WeaverBody):
    path: str
    include_optimizer: bool = False


class CreateSamplingSession(WeaverBody):
    sampling_session_seq_id: int = Field(ge=0)
    base_model: str | None = None
    model_path: str | None = None
    model_id: str | None = None


class SamplingSpec(WeaverBody):
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = []
    stop_token_ids: list[int] = []
    seed: int | None = None
    sampling_seed: int | None = None


class SampleBody(WeaverBody):
    prompt: ModelInput
    sampling_params: SamplingSpec = SamplingSpec()
    num_samples: int = Field(default=1, ge=1, le=256)
    prompt_logprobs: bool = False
    topk_prompt_logprobs: int = 0
    return_sampling_mask: bool = False
    return_old_logprob: bool = False
    return_moe_topk_indices: bool = False
    score_centering: dict[str, Any] | None = None


class LogprobsBody(WeaverBody):
    prompt: ModelInput
    return_rollout_token_expert: bool = False


# --- responses of the listing calls (the fields the SDK and its CLI read) -------------------


class Pagination(WeaverBody):
    total_count: int
    limit: int
    offset: int


class Price(WeaverBody):
    unit: str = "million_tokens"
    unit_price_micros: int = 0  # a self-hosted Loom charges nothing


class CatalogModel(WeaverBody):
    id: str
    name: str
    status: Literal["available", "unavailable"]  # available: rollout serves it
    visibility: str | None = None
    training_modes: list[Literal["lora", "full_ft"]]
    prices: dict[str, Price]  # "<usage kind>:<mode>": each mode's four prices
    config: dict[str, Any]
    metadata: dict[str, Any]


class Catalog(WeaverBody):
    items: list[CatalogModel]
    pagination: Pagination


class LoraSummary(WeaverBody):
    rank: int


class ModelSummary(WeaverBody):
    """A training model (a Loom job made by the Weaver SDK): `list_models` and
    `list_training_runs` items."""

    id: str
    session_id: str | None
    model_seq_id: int | None
    base_model: str
    training_mode: Literal["lora", "full_ft"]
    lora_config: LoraSummary | None
    status: str  # the Loom job's status
    created_at: datetime
    last_request_at: datetime  # Loom's latest record of it: creation or newest checkpoint


class ModelPage(WeaverBody):
    items: list[ModelSummary]
    pagination: Pagination


# --- responses of the other calls (the SDK's types' fields, as Loom fills them) ------------


class SessionInfo(WeaverBody):
    id: str
    name: str | None
    status: Literal["active"] = "active"
    created_at: str  # ISO 8601


class SessionAlive(WeaverBody):
    id: str
    status: Literal["active"] = "active"


class MetricsAccepted(WeaverBody):
    accepted: int


class TrainingModel(WeaverBody):
    id: str
    base_model: str
    training_mode: Literal["lora", "full_ft"]
    lora_config: LoraSummary | None
    tokenizer_path: str
    status: Literal["active", "terminated"]
    created_at: str  # ISO 8601


class Terminated(WeaverBody):
    model_id: str
    trainer: Literal["terminated"] = "terminated"
    inference: Literal["terminated"] = "terminated"


class Operation(WeaverBody):
    """A call that answers later, polled with GET /operations/{id}; the error fields are
    present only when it failed (routes answer it with `response_model_exclude_unset`)."""

    id: str
    status: Literal["pending", "done", "error"]
    response: dict[str, Any] | None
    error_code: str | None = None
    error_message: str | None = None
    retryable: bool | None = None


class Checkpoint(WeaverBody):
    id: str
    path: str
    name: str
    checkpoint_type: str
    status: Literal["completed"] = "completed"
    size_bytes: int | None
    step: int | None
    ttl_seconds: int | None
    created_at: str  # ISO 8601
    expires_at: str | None


class Checkpoints(WeaverBody):
    items: list[Checkpoint]


class SamplingSession(WeaverBody):
    id: str
    base_model: str
    model_path: str | None
    model_id: str | None
    weight_version: int
    tokenizer_path: str


class TrainingRunDetail(ModelSummary):
    checkpoints: list[Checkpoint]
