"""Wire models of the trainer (imported by the SDK)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Self

from pydantic import AwareDatetime, Field, model_validator

from modelstate.schemas import AliasName, JobId
from services.common.schemas import RESOURCE_ID_PATTERN, LenientModel, StrictModel


class TrainingMode(StrEnum):
    full = "full"
    lora = "lora"


class LoraConfig(StrictModel):
    rank: int = Field(default=8, ge=1, le=1024)
    alpha: float = Field(default=16.0, gt=0)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] = [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]


class CreateModelRequest(StrictModel):
    job_id: JobId
    base_model: str = Field(min_length=1, max_length=1024)
    mode: TrainingMode = TrainingMode.lora
    lora: LoraConfig = LoraConfig()
    seed: int = 0


class Restored(LenientModel):
    """How a sharded trainer brought a model back after one of its ranks failed (its ranks
    were started again, the models made anew): from the last checkpoint the model saved or
    loaded (`save_state`/`load_state`), or at its base weights where it had none. Training
    since that checkpoint is lost: a client resumes from `step`."""

    at: datetime
    failed_rank: int
    failed_operation: str
    checkpoint: str | None = Field(
        description="The checkpoint reloaded (weights, optimizer "
        "moments, step); None: the base weights, step 0."
    )
    checkpoint_job_id: str | None = Field(
        default=None,
        description="Whose checkpoint it was, when another job's (load_state with job_id).",
    )
    unreadable_checkpoint: str | None = Field(
        default=None,
        description="The last checkpoint, when it could not be read back, and "
        "why: the model came back at its base weights instead (load_state loads it again if "
        "the cause has passed).",
    )
    step: int


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
    restored: Restored | None = Field(
        default=None, description="The last time a rank failure rolled the model back."
    )


class Datum(StrictModel):
    """One training sequence. Position i of every per-token list refers to predicting
    `input_ids[i]` from the tokens before it, so position 0 never carries loss."""

    input_ids: list[int] = Field(min_length=2, max_length=32768)
    loss_mask: list[float]
    advantages: list[float] | None = None
    logprobs: list[float] | None = Field(
        default=None, description="Log-probabilities the sampler gave each token (IS/PPO)."
    )
    proximal_logprobs: list[float] | None = Field(
        default=None,
        description="With tis_cap: the trainer's logprobs under the weights "
        "before this batch's first update (what the first of several passes on one batch "
        "returns, return_logprobs). The clip is taken against them, the truncated weight is "
        "min(pi_proximal / pi_sampler, tis_cap). None: the current weights (a first pass).",
    )

    @model_validator(mode="after")
    def _same_lengths(self) -> Self:
        n = len(self.input_ids)
        for name in ("loss_mask", "advantages", "logprobs", "proximal_logprobs"):
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
    cispo = "cispo"
    dro = "dro"
    reinforce = "reinforce"


# The per-token fields of a Datum each loss reads besides input_ids and loss_mask.
LOSS_INPUTS: dict[LossName, tuple[str, ...]] = {
    LossName.cross_entropy: (),
    LossName.importance_sampling: ("advantages", "logprobs"),
    LossName.ppo: ("advantages", "logprobs"),
    LossName.cispo: ("advantages", "logprobs"),
    LossName.dro: ("advantages", "logprobs"),
    LossName.reinforce: ("advantages",),
}
# Default ratio bounds (clip_low, clip_high): ratio in [1 - clip_low, 1 + clip_high].
DEFAULT_CLIPS = {
    LossName.ppo: (0.2, 0.28),
    LossName.cispo: (1.0, 3.0),
}  # CISPO: no lower bound, the ratio capped at 4


class LossAggregation(StrEnum):
    """How per-token terms become one number (see `services/trainer/losses.py`)."""

    token_mean = "token_mean"  # DAPO: every token of the batch weighs the same
    sequence_mean = "sequence_mean"  # GRPO: mean over sequences of each one's token mean
    sum_normalized = "sum_normalized"  # Dr. GRPO: token sum / (sequences x a constant)
    sum = "sum"  # Tinker's convention: the plain token sum, no normalization


class LossConfig(StrictModel):
    """The loss of a forward_backward (see `services/trainer/losses.py` for each formula)."""

    name: LossName = LossName.cross_entropy
    clip_low: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="ppo, cispo: ratio >= 1 - clip_low (default "
        "0.2 for ppo; 1.0, no lower bound, for cispo)",
    )
    clip_high: float | None = Field(
        default=None,
        ge=0,
        le=10,
        description="ppo, cispo: ratio <= 1 + clip_high (default 0.28 for ppo; 3.0 for cispo)",
    )
    clip_ratio_c: float | None = Field(
        default=None,
        gt=1,
        description="ppo: dual clip. Where the advantage is negative, a "
        "token's term is at least clip_ratio_c * A (3.0 is verl's value), so a stale token "
        "with a huge ratio cannot blow the loss up. None: no dual clip.",
    )
    dro_beta: float = Field(
        default=0.05,
        gt=0,
        description="dro: weight of the quadratic penalty 1/2 * dro_beta * log(pi / pi_sampler)^2",
    )
    kl_coef: float = Field(default=0.0, ge=0, description="Weight of KL to the reference model")
    temperature: float = Field(
        default=1.0,
        gt=0,
        le=10,
        description="The temperature the data was sampled at: the "
        "trainer divides the logits by it, so the policy whose ratio to the sampler's "
        "logprobs is taken (those of the distribution really sampled from) is the same "
        "distribution. Top-p/top-k truncation is not replayed: tis_cap corrects what remains.",
    )
    aggregation: LossAggregation = LossAggregation.token_mean
    normalizer: int | None = Field(
        default=None,
        ge=1,
        description="sum_normalized: the constant, e.g. the generation "
        "budget in tokens per sequence",
    )
    tis_cap: float | None = Field(
        default=None,
        gt=0,
        description="Truncated importance sampling for stale samples "
        "(decoupled PPO): weight each token by min(pi_proximal / pi_sampler, tis_cap), "
        "pi_proximal being the trainer's policy before this batch's updates (a datum's "
        "proximal_logprobs, else the current weights, without gradient); the policy ratio, "
        "and its clip, are then taken against pi_proximal",
    )

    @model_validator(mode="after")
    def _normalizer_when_needed(self) -> Self:
        if (self.aggregation == LossAggregation.sum_normalized) != (self.normalizer is not None):
            raise ValueError(
                "normalizer is required with aggregation 'sum_normalized' and "
                "means nothing with any other aggregation"
            )
        if self.tis_cap is not None and "logprobs" not in LOSS_INPUTS[self.name]:
            raise ValueError(
                f"tis_cap corrects a ratio to the sampler's logprobs, which "
                f"{self.name.value} does not use"
            )
        if self.clip_ratio_c is not None and self.name != LossName.ppo:
            raise ValueError(f"clip_ratio_c is ppo's dual clip, not {self.name.value}'s")
        if (self.clip_low, self.clip_high) != (None, None) and self.name not in DEFAULT_CLIPS:
            raise ValueError(
                f"clip_low and clip_high apply to {' and '.join(DEFAULT_CLIPS)}, "
                f"not {self.name.value}"
            )
        return self

    @property
    def clips(self) -> tuple[float, float]:
        """(clip_low, clip_high), each the loss's default where not given."""
        low, high = DEFAULT_CLIPS.get(self.name, (0.0, 0.0))
        return (
            low if self.clip_low is None else self.clip_low,
            high if self.clip_high is None else self.clip_high,
        )


def check_loss_inputs(data: list[Datum], loss: LossConfig) -> None:
    for i, datum in enumerate(data):
        missing = [name for name in LOSS_INPUTS[loss.name] if getattr(datum, name) is None]
        if missing:
            raise ValueError(
                f"data[{i}]: loss {loss.name.value!r} needs "
                f"{' and '.join(LOSS_INPUTS[loss.name])}; missing {missing}"
            )


class ForwardBackwardRequest(StrictModel):
    data: list[Datum] = Field(min_length=1, max_length=4096)
    loss: LossConfig = LossConfig()
    return_logprobs: bool = Field(
        default=False,
        description="Also return each datum's per-token logprobs, as the "
        "forward of this call computed them (the weights before this call's gradients).",
    )

    @model_validator(mode="after")
    def _needs_fields(self) -> Self:
        check_loss_inputs(self.data, self.loss)
        return self


class ForwardBackwardResult(LenientModel):
    loss: float
    num_tokens: int
    metrics: dict[str, float]
    logprobs: list[list[float]] | None = Field(
        default=None, description="When asked for: as `ForwardResult.logprobs`."
    )


class AdamParams(StrictModel):
    # 0 is a step that moves nothing (warm-up schedules start there); Adam's moments update.
    lr: float = Field(default=1e-4, ge=0, le=1)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    # 0.999 as in torch.optim.AdamW, TRL and most papers (the Tinker and Weaver routes keep
    # their own clients' defaults); recipes that want a shorter memory ask for 0.95.
    beta2: float = Field(default=0.999, ge=0, lt=1)
    eps: float = Field(default=1e-8, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    grad_clip: float | None = Field(default=1.0, gt=0)


class OptimStepRequest(StrictModel):
    adam: AdamParams = AdamParams()


class OptimStepResult(LenientModel):
    step: int
    grad_norm: float
    lr: float
    applied: bool = True  # False: the gradient was exactly zero and the weights did not move


class SaveWeightsRequest(StrictModel):
    aliases: list[AliasName] = []
    metrics: dict[str, float] = {}


class SaveWeightsResult(LenientModel):
    job_id: str
    number: int
    kind: str
    step: int


class ForwardRequest(StrictModel):
    """Per-token logprobs of sequences under the current weights, and a loss's value if
    asked (no gradient either way)."""

    data: list[Datum] = Field(min_length=1, max_length=4096)
    loss: LossConfig | None = None

    @model_validator(mode="after")
    def _needs_fields(self) -> Self:
        if self.loss is not None:
            check_loss_inputs(self.data, self.loss)
        return self


class ForwardResult(LenientModel):
    logprobs: list[list[float]] = Field(
        description="One list per datum, as long as its input_ids; position 0 is 0.0."
    )
    loss: float | None = Field(default=None, description="When a loss was given.")


CheckpointName = Annotated[
    str, Field(pattern=RESOURCE_ID_PATTERN, description="Unique per job; a name is never reused.")
]


class SaveStateRequest(StrictModel):
    """Checkpoint the trainer state (trainable weights, optimizer moments, step) to resume
    from later; gradients accumulated since the last optim_step are not part of it."""

    name: CheckpointName
    series: CheckpointName | None = Field(
        default=None,
        description="A series of checkpoints this one belongs to (a managed "
        "run's): the trainer keeps the newest LOOM_TRAINER_KEEP_SERIES_CHECKPOINTS of a series "
        "and deletes older ones as new ones land. None: kept until deleted.",
    )
    expires_at: AwareDatetime | None = Field(
        default=None,
        description="When the checkpoint expires: from then on it is neither "
        "listed nor loadable, and its files go. None: it never expires.",
    )


class CheckpointExpiry(StrictModel):
    expires_at: AwareDatetime | None = Field(description="A new expiry; None: never expires.")


class LoadStateRequest(StrictModel):
    name: CheckpointName
    job_id: JobId | None = Field(
        default=None,
        description="The job that saved the checkpoint (default: this model's "
        "own). Another job's checkpoint fits when it was saved from the same base model, "
        "training mode and LoRA configuration.",
    )
    optimizer: bool = Field(
        default=True,
        description="Restore the optimizer's moments too; false: weights and "
        "step only, and the optimizer starts afresh at the next optim_step.",
    )


class StateCheckpoint(LenientModel):
    job_id: str
    name: str
    step: int
    last_version: int
    has_optimizer: bool
    bytes: int
    created_at: datetime
    series: str | None = None
    expires_at: datetime | None = None


class CheckpointList(LenientModel):
    checkpoints: list[StateCheckpoint]
