"""JSON bodies of the Tinker protocol (lenient: the SDK adds fields between versions)."""

from __future__ import annotations

from typing import Any

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


class SaveForSampler(LenientModel):
    model_id: str
    seq_id: int
    path: str | None = None
    sampling_session_seq_id: int | None = None


class SaveState(LenientModel):
    model_id: str
    seq_id: int
    path: str | None = None  # the checkpoint's name
    ttl_seconds: int | None = None
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
