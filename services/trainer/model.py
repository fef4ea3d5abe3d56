"""One trainable model: a Hugging Face causal LM, trained in full or through a LoRA adapter.

Like Tinker, gradients add up over `forward_backward` calls until `optim_step` applies them.
Every method runs on the operation queue's worker thread, one at a time per model.
"""

from __future__ import annotations

from pathlib import Path

import peft
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.utils import logging as hf_logging

from services.common.errors import Conflict, InvalidInput
from services.trainer.batch import Batch, collate, token_logprobs, unpad, validate_data
from services.trainer.losses import compute_loss
from services.trainer.schemas import (
    AdamParams,
    CreateModelRequest,
    Datum,
    ForwardBackwardResult,
    ForwardResult,
    LossConfig,
    ModelInfo,
    OptimStepResult,
    TrainingMode,
)
from services.trainer.weights_files import TokenizerFiles, write_adapter, write_full


def resolve_device(setting: str) -> torch.device:
    """'auto' → cuda when available, else cpu; anything else as given."""
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(setting)


def load_causal_lm(path: str, device: torch.device) -> PreTrainedModel:
    """fp32 weights: on CPU there is no faster dtype, and Adam wants full precision anyway."""
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"Cannot load base model {path!r}: {exc}") from exc
    return model.to(device)


class TrainerModel:
    def __init__(self, spec: CreateModelRequest, model_path: str, device: torch.device) -> None:
        self.spec = spec
        self.model_path = model_path
        self.device = device
        base = load_causal_lm(model_path, device)
        self.vocab_size: int = base.get_input_embeddings().num_embeddings
        self.max_length: int = base.config.max_position_embeddings
        self.network: PreTrainedModel | peft.PeftModel = (
            base if spec.mode == TrainingMode.full else self._with_adapter(base)
        )
        self.params = [p for p in self.network.parameters() if p.requires_grad]
        self.step = 0
        self.last_version = 0
        self._optimizer: torch.optim.AdamW | None = None
        self._frozen_reference: PreTrainedModel | None = None
        self._has_gradients = False
        self._tokenizer_files = TokenizerFiles(model_path)

    def _with_adapter(self, base: PreTrainedModel) -> peft.PeftModel:
        lora = self.spec.lora
        config = peft.LoraConfig(
            r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
            target_modules=lora.target_modules, task_type="CAUSAL_LM",
        )
        # The adapter's random init depends on the job's seed only, not on the global RNG.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.spec.seed)
            try:
                return peft.get_peft_model(base, config)
            except ValueError as exc:  # e.g. target modules the model does not have
                raise InvalidInput(f"Cannot apply LoRA to {self.spec.base_model!r}: {exc}") from exc

    def info(self) -> ModelInfo:
        return ModelInfo(
            model_id=self.spec.job_id, job_id=self.spec.job_id, base_model=self.spec.base_model,
            mode=self.spec.mode,
            lora=self.spec.lora if self.spec.mode == TrainingMode.lora else None,
            num_params=sum(p.numel() for p in self.network.parameters()),
            trainable_params=sum(p.numel() for p in self.params),
            step=self.step, last_version=self.last_version,
        )

    def validate(self, data: list[Datum], *, needs_loss: bool) -> None:
        """Checked when an operation is submitted, so its methods below may assume it."""
        validate_data(data, self.vocab_size, self.max_length, needs_loss=needs_loss)

    # --- operations -----------------------------------------------------------------------

    def forward_backward(self, data: list[Datum], loss_config: LossConfig) -> ForwardBackwardResult:
        batch = collate(data, self.device)
        reference = self._reference_logprobs(batch) if loss_config.kl_coef > 0 else None
        self.network.train()
        logprobs = self._logprobs(self.network, batch)
        loss, metrics = compute_loss(
            loss_config, logprobs, batch.loss_mask, old_logprobs=batch.old_logprobs,
            advantages=batch.advantages, ref_logprobs=reference,
        )
        if not torch.isfinite(loss):
            raise InvalidInput(
                f"The loss is {loss.item()} (check advantages and logprobs for huge or "
                "non-finite values); no gradients were accumulated"
            )
        loss.backward()
        self._has_gradients = True
        return ForwardBackwardResult(loss=loss.item(), num_tokens=batch.num_tokens,
                                     metrics=metrics)

    def forward(self, data: list[Datum]) -> ForwardResult:
        batch = collate(data, self.device)
        self.network.eval()
        with torch.no_grad():
            logprobs = self._logprobs(self.network, batch)
        return ForwardResult(logprobs=unpad(logprobs, batch.lengths))

    def optim_step(self, adam: AdamParams) -> OptimStepResult:
        if not self._has_gradients:
            raise Conflict("No gradients to apply: call forward_backward before optim_step")
        optimizer = self._optimizer_for(adam)
        if adam.grad_clip is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, adam.grad_clip)
        else:
            grad_norm = torch.nn.utils.get_total_norm(
                [p.grad for p in self.params if p.grad is not None])
        self._has_gradients = False
        if not torch.isfinite(grad_norm):
            optimizer.zero_grad(set_to_none=True)
            raise InvalidInput(f"The gradient norm is {grad_norm.item()}: step skipped, "
                               "accumulated gradients dropped")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return OptimStepResult(step=self.step, grad_norm=grad_norm.item(), lr=adam.lr)

    def save(self, directory: Path, shard_bytes: int) -> None:
        """A Hugging Face model directory (full, in shards of at most `shard_bytes`) or a PEFT
        adapter directory (LoRA)."""
        if isinstance(self.network, peft.PeftModel):
            write_adapter(self.network, directory)
            return
        write_full(self.network, directory, shard_bytes)
        self._tokenizer_files.write(directory)

    # --- internals ------------------------------------------------------------------------

    def _optimizer_for(self, adam: AdamParams) -> torch.optim.AdamW:
        """One AdamW for the model's life (its moments persist); each call may retune it."""
        hyper = {"lr": adam.lr, "betas": (adam.beta1, adam.beta2), "eps": adam.eps,
                 "weight_decay": adam.weight_decay}
        if self._optimizer is None:
            self._optimizer = torch.optim.AdamW(self.params, **hyper)
        else:
            for group in self._optimizer.param_groups:
                group.update(hyper)
        return self._optimizer

    def _logprobs(self, network: torch.nn.Module, batch: Batch) -> torch.Tensor:
        output = network(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                         use_cache=False)
        return token_logprobs(output.logits, batch.input_ids)

    def _reference_logprobs(self, batch: Batch) -> torch.Tensor:
        """Logprobs under the base model: LoRA turns its adapter off; full training keeps a
        frozen copy of the base, loaded from disk on first use (the live weights have moved)."""
        with torch.no_grad():
            if isinstance(self.network, peft.PeftModel):
                self.network.eval()
                with self.network.disable_adapter():
                    return self._logprobs(self.network, batch)
            if self._frozen_reference is None:
                self._frozen_reference = load_causal_lm(self.model_path, self.device).eval()
                self._frozen_reference.requires_grad_(False)
            return self._logprobs(self._frozen_reference, batch)
