"""Wire models of the trainer (imported by the SDK)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Self

from pydantic import Field, model_validator

from modelstate.schemas import AliasName, JobId
from services.common.schemas import LenientModel, StrictModel


class TrainingMode(StrEnum):
    full = "full"
    lora = "lora"


class LoraConfig(StrictModel):
    rank: int = Field(default=8, ge=1, le=1024)
    alpha: float = Field(default=16.0, gt=0)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj",
                                 "gate_proj", "up_proj", "down_proj"]


class CreateModelRequest(StrictModel):
    job_id: JobId
    base_model: str = Field(min_length=1, max_length=1024)
    mode: TrainingMode = TrainingMode.lora
    lora: LoraConfig = LoraConfig()
    seed: int = 0


class ModelInfo(LenientModel):
    model_id: str
    job_id: str
    base_model: str
    mode: TrainingMode
    lora: LoraConfig | None
    num_params: int
    trainable_params: int
    step: int
    last_version: int


class Datum(StrictModel):
    """One training sequence. Position i of every per-token list refers to predicting
    `input_ids[i]` from the tokens before it, so position 0 never carries loss."""

    input_ids: list[int] = Field(min_length=2, max_length=32768)
    loss_mask: list[float]
    advantages: list[float] | None = None
    logprobs: list[float] | None = Field(
        default=None, description="Log-probabilities the sampler gave each token (IS/PPO)."
    )

    @model_validator(mode="after")
    def _same_lengths(self) -> Self:
        n = len(self.input_ids)
        for name in ("loss_mask", "advantages", "logprobs"):
            values = getattr(self, name)
            if values is not None and len(values) != n:
                raise ValueError(f"{name} has {len(values)} entries; input_ids has {n}")
        if any(t < 0 for t in self.input_ids):
            raise ValueError("input_ids must be non-negative token ids")
        return self


class LossName(StrEnum):
    cross_entropy = "cross_entropy"
    importance_sampling = "importance_sampling"
    ppo = "ppo"


class LossAggregation(StrEnum):
    """How per-token terms become one number (see `services/trainer/losses.py`)."""

    token_mean = "token_mean"  # DAPO: every token of the batch weighs the same
    sequence_mean = "sequence_mean"  # GRPO: mean over sequences of each one's token mean
    sum_normalized = "sum_normalized"  # Dr. GRPO: token sum / (sequences x a constant)
    sum = "sum"  # Tinker's convention: the plain token sum, no normalization


class LossConfig(StrictModel):
    name: LossName = LossName.cross_entropy
    clip_low: float = Field(default=0.2, ge=0, le=1, description="PPO: ratio >= 1 - clip_low")
    clip_high: float = Field(default=0.28, ge=0, le=10, description="PPO: ratio <= 1 + clip_high")
    kl_coef: float = Field(default=0.0, ge=0, description="Weight of KL to the reference model")
    aggregation: LossAggregation = LossAggregation.token_mean
    normalizer: int | None = Field(
        default=None, ge=1, description="sum_normalized: the constant, e.g. the generation "
        "budget in tokens per sequence")
    tis_cap: float | None = Field(
        default=None, gt=0, description="Truncated importance sampling for stale samples: "
        "weight each token by min(pi_trainer / pi_sampler, tis_cap), the ratio taken against "
        "the current weights (no gradient) and the sampler's logprobs; the policy ratio is "
        "then taken against the current weights")

    @model_validator(mode="after")
    def _normalizer_when_needed(self) -> Self:
        if (self.aggregation == LossAggregation.sum_normalized) != (self.normalizer is not None):
            raise ValueError("normalizer is required with aggregation 'sum_normalized' and "
                             "means nothing with any other aggregation")
        if self.tis_cap is not None and self.name == LossName.cross_entropy:
            raise ValueError("tis_cap applies to the policy losses, not cross_entropy")
        return self


class ForwardBackwardRequest(StrictModel):
    data: list[Datum] = Field(min_length=1, max_length=4096)
    loss: LossConfig = LossConfig()

    @model_validator(mode="after")
    def _needs_fields(self) -> Self:
        if self.loss.name != LossName.cross_entropy:
            for i, datum in enumerate(self.data):
                if datum.advantages is None or datum.logprobs is None:
                    raise ValueError(
                        f"data[{i}]: loss {self.loss.name.value!r} needs advantages and logprobs"
                    )
        return self


class ForwardBackwardResult(LenientModel):
    loss: float
    num_tokens: int
    metrics: dict[str, float]


class AdamParams(StrictModel):
    lr: float = Field(default=1e-4, gt=0, le=1)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.95, ge=0, lt=1)
    eps: float = Field(default=1e-8, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    grad_clip: float | None = Field(default=1.0, gt=0)


class OptimStepRequest(StrictModel):
    adam: AdamParams = AdamParams()


class OptimStepResult(LenientModel):
    step: int
    grad_norm: float
    lr: float


class SaveWeightsRequest(StrictModel):
    aliases: list[AliasName] = []
    metrics: dict[str, float] = {}


class SaveWeightsResult(LenientModel):
    job_id: str
    number: int
    kind: str
    step: int


class ForwardRequest(StrictModel):
    """Per-token logprobs of sequences under the current weights (no gradient, no loss)."""

    data: list[Datum] = Field(min_length=1, max_length=4096)


class ForwardResult(LenientModel):
    logprobs: list[list[float]] = Field(
        description="One list per datum, as long as its input_ids; position 0 is 0.0."
    )


CheckpointName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
                                      description="Unique per job; a name is never reused.")]


class SaveStateRequest(StrictModel):
    """Checkpoint the trainer state (trainable weights, optimizer moments, step) to resume
    from later; gradients accumulated since the last optim_step are not part of it."""

    name: CheckpointName


class LoadStateRequest(StrictModel):
    name: CheckpointName
    job_id: JobId | None = Field(
        default=None, description="The job that saved the checkpoint (default: this model's "
        "own). Another job's checkpoint fits when it was saved from the same base model, "
        "training mode and LoRA configuration.")
    optimizer: bool = Field(
        default=True, description="Restore the optimizer's moments too; false: weights and "
        "step only, and the optimizer starts afresh at the next optim_step.")


class StateCheckpoint(LenientModel):
    job_id: str
    name: str
    step: int
    last_version: int
    has_optimizer: bool
    bytes: int
    created_at: datetime


class CheckpointList(LenientModel):
    checkpoints: list[StateCheckpoint]
