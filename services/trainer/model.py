"""One trainable model: a Hugging Face causal LM, trained in full or through a LoRA adapter
(an adapter of a base shared with the other LoRA jobs on it, see `lora_host`).

Like Tinker, gradients add up over `forward_backward` calls until `optim_step` applies them.
Every method runs on the operation queue's worker thread, one at a time per model.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import peft
import torch
from torch.distributed.tensor import DTensor
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedModel
from transformers.utils import logging as hf_logging

from services.common.errors import Conflict, InvalidInput
from services.trainer.batch import (
    Batch,
    collate,
    micro_batches,
    token_logprobs,
    unpad,
    validate_data,
)
from services.trainer.lora_host import LoraHost
from services.trainer.losses import Totals, compute_loss
from services.trainer.page_reserve import PageReserve
from services.trainer.parallel import SingleProcess
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
from services.trainer.settings import DEFAULT_MICRO_BATCH_TOKENS
from services.trainer.weights_files import TokenizerFiles, write_adapter, write_full


def resolve_device(setting: str) -> torch.device:
    """'auto' → cuda when available, else cpu; anything else as given."""
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(setting)


def micro_batch_budget(device: torch.device, setting: int | None = None) -> int:
    """The setting, else the default for the device's type."""
    return setting or DEFAULT_MICRO_BATCH_TOKENS.get(device.type, DEFAULT_MICRO_BATCH_TOKENS["cpu"])


def load_causal_lm(path: str, device: torch.device) -> PreTrainedModel:
    """fp32 weights: on CPU there is no faster dtype, and Adam wants full precision anyway."""
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"Cannot load base model {path!r}: {exc}") from exc
    return model.to(device)


def empty_causal_lm(path: str) -> PreTrainedModel:
    """The model `load_causal_lm` loads, its weights not read (on the meta device, where a
    sharded rank builds it, not even allocated)."""
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"Cannot load base model {path!r}: {exc}") from exc
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with suppress(OSError):  # as from_pretrained: the model's own, where it has one
        model.generation_config = GenerationConfig.from_pretrained(path)
    return model


class TrainerModel:
    def __init__(
        self,
        spec: CreateModelRequest,
        model_path: str,
        device: torch.device,
        host: LoraHost | None,
        micro_batch_tokens: int,
        parallel: SingleProcess | None = None,
    ) -> None:
        """Full training loads its own copy of the base; LoRA adds an adapter to `host`.
        `parallel`: how it shares the work with other ranks (by default it has none)."""
        self.parallel = parallel or SingleProcess()
        self.micro_batch_tokens = micro_batch_tokens
        self.spec = spec
        self.model_path = model_path
        self.device = device
        self._host = host if spec.mode == TrainingMode.lora else None
        self._full: PreTrainedModel | None = None
        if self._host is None:
            self._full = self._load_base()
            base = self._full
            self._named = [(n, p) for n, p in base.named_parameters() if p.requires_grad]
        else:
            base = self._host.base
            self._named = self._host.attach(spec.job_id, spec.lora, spec.seed)
        self.params = [p for _, p in self._named]
        self.vocab_size: int = base.get_input_embeddings().num_embeddings
        self.max_length: int = base.config.max_position_embeddings
        self._base_params = (
            self._host.base_params if self._host else sum(p.numel() for p in base.parameters())
        )
        self.step = 0
        self.last_version = 0
        self._optimizer: torch.optim.AdamW | None = None
        self._frozen_reference: PreTrainedModel | None = None
        self._has_gradients = False
        self._tokenizer_files = TokenizerFiles(model_path)

    @contextmanager
    def network(self) -> Iterator[PreTrainedModel | peft.PeftModel]:
        """The module to run: the full model, or the shared PEFT model on this job's adapter."""
        if self._host is None:
            assert self._full is not None
            network: PreTrainedModel | peft.PeftModel = self._full
            try:
                yield network
            finally:
                self.parallel.settle(network)
        else:
            with self._host.using(self.spec.job_id) as network:
                try:
                    yield network
                finally:
                    self.parallel.settle(network)

    @property
    def sharded(self) -> bool:
        """Whether its trainable weights are split across ranks (full training on ranks)."""
        return self._host is None and self.parallel.world_size > 1

    def info(self) -> ModelInfo:
        return ModelInfo(
            model_id=self.spec.job_id,
            job_id=self.spec.job_id,
            base_model=self.spec.base_model,
            mode=self.spec.mode,
            lora=self.spec.lora if self.spec.mode == TrainingMode.lora else None,
            num_params=self._base_params
            + (sum(p.numel() for p in self.params) if self._host else 0),
            trainable_params=sum(p.numel() for p in self.params),
            step=self.step,
            last_version=self.last_version,
        )

    def validate(self, data: list[Datum], *, needs_loss: bool) -> None:
        """Checked when an operation is submitted, so its methods below may assume it."""
        validate_data(data, self.vocab_size, self.max_length, needs_loss=needs_loss)

    # --- operations -----------------------------------------------------------------------

    def forward_backward(
        self, data: list[Datum], loss_config: LossConfig, return_logprobs: bool = False
    ) -> ForwardBackwardResult:
        batch = collate(data, self.device)
        with self.network() as network:
            network.train()
            loss, metrics, logprobs = self._loss(network, batch, loss_config, backward=True)
        self._has_gradients = True
        if return_logprobs:
            logprobs = self.parallel.sum_rows(logprobs)
        return ForwardBackwardResult(
            loss=loss,
            num_tokens=batch.num_tokens,
            metrics=metrics,
            logprobs=unpad(logprobs, batch.lengths) if return_logprobs else None,
        )

    def forward(self, data: list[Datum], loss_config: LossConfig | None = None) -> ForwardResult:
        batch = collate(data, self.device)
        with self.network() as network, torch.no_grad():
            network.eval()
            if loss_config is None:
                logprobs = self.parallel.sum_rows(self._logprobs(network, batch))
                return ForwardResult(logprobs=unpad(logprobs, batch.lengths))
            loss, _, logprobs = self._loss(network, batch, loss_config, backward=False)
            logprobs = self.parallel.sum_rows(logprobs)
        # No token carrying loss is a loss of 0 (a mean over no tokens would be NaN).
        value = loss if batch.num_tokens else 0.0
        return ForwardResult(logprobs=unpad(logprobs, batch.lengths), loss=value)

    def optim_step(self, adam: AdamParams) -> OptimStepResult:
        if not self._has_gradients:
            raise Conflict("No gradients to apply: call forward_backward before optim_step")
        optimizer = self.optimizer_for(adam)
        grad_norm = self.parallel.grad_norm(self.params, adam.grad_clip)
        self._has_gradients = False
        if not torch.isfinite(grad_norm):
            optimizer.zero_grad(set_to_none=True)
            raise InvalidInput(
                f"The gradient norm is {grad_norm.item()}: step skipped, "
                "accumulated gradients dropped"
            )
        # No gradient, no update: AdamW would still move the weights through its momentum and
        # weight decay (an RL batch whose advantages are all zero must leave the policy alone).
        applied = grad_norm.item() > 0.0
        if applied:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return OptimStepResult(
            step=self.step, grad_norm=grad_norm.item(), lr=adam.lr, applied=applied
        )

    def reset_optimizer(self) -> ModelInfo:
        """A fresh AdamW at the next step (no moments), pending gradients dropped; the step
        count goes on."""
        self._optimizer = None
        for param in self.params:
            param.grad = None
        self._has_gradients = False
        return self.info()

    def save(self, directory: Path, shard_bytes: int, reserve: PageReserve | None = None) -> None:
        """A Hugging Face model directory (full, in shards of at most `shard_bytes`) or a PEFT
        adapter directory (LoRA); weight files over `reserve`'s where it has them."""
        with self.network() as network:
            if isinstance(network, peft.PeftModel):
                if self.parallel.rank == 0:  # every rank holds the whole adapter
                    write_adapter(network, directory, self.spec.job_id, reserve)
                return
            write_full(network, directory, shard_bytes, reserve, self.parallel)
        if self.parallel.rank == 0:
            self._tokenizer_files.write(directory)

    # --- checkpoints (checkpoints.py) -------------------------------------------------------

    def named_trainable(self) -> list[tuple[str, torch.nn.Parameter]]:
        return list(self._named)

    def state_bytes(self) -> dict[str, int]:
        """Bytes of trainable weights, their gradients and the optimizer's state that this
        process holds (on a rank: its shards), and of the frozen weights the model runs on
        (a LoRA job's shared base, a full job's reference copy once KL loaded it)."""
        state = (
            []
            if self._optimizer is None
            else [
                t
                for moments in self._optimizer.state.values()
                for t in moments.values()
                if isinstance(t, torch.Tensor)
            ]
        )
        frozen = self._host.base if self._host is not None else self._frozen_reference
        return {
            "weights": _held(self.params),
            "gradients": _held([p.grad for p in self.params if p.grad is not None]),
            "optimizer": _held(state),
            "frozen": 0
            if frozen is None
            else _held([p for p in frozen.parameters() if not p.requires_grad]),
        }

    def optimizer(self) -> torch.optim.AdamW | None:
        return self._optimizer

    def optimizer_state(self) -> dict[str, object] | None:
        return None if self._optimizer is None else self._optimizer.state_dict()

    def restore(
        self,
        weights: dict[str, torch.Tensor],
        optimizer: dict[str, object] | None,
        step: int,
        last_version: int | None,
    ) -> None:
        """Weights, optimizer moments (None: a fresh optimizer) and step from a checkpoint;
        pending gradients dropped. `last_version` None keeps the model's own."""
        names = {n for n, _ in self._named}
        if set(weights) != names:
            missing, extra = sorted(names - set(weights))[:3], sorted(set(weights) - names)[:3]
            raise InvalidInput(
                f"The checkpoint does not fit job {self.spec.job_id}'s model "
                f"(missing {missing}, unexpected {extra})."
            )
        with torch.no_grad():
            for name, param in self._named:
                if weights[name].shape != param.shape:
                    raise InvalidInput(
                        f"The checkpoint's {name} has shape "
                        f"{tuple(weights[name].shape)}, the model's "
                        f"{tuple(param.shape)}."
                    )
            for name, param in self._named:
                param.copy_(self.parallel.shard_like(weights[name], param))
                param.grad = None
        self._has_gradients = False
        self._optimizer = None
        if optimizer is not None:
            for index, moments in optimizer["state"].items():  # type: ignore[attr-defined]
                param = self.params[index]
                for key, value in moments.items():
                    if value.shape == param.shape:  # not `step`
                        moments[key] = self.parallel.shard_like(value, param)
            self.optimizer_for(AdamParams()).load_state_dict(optimizer)
        self.restore_position(step, last_version)

    def restore_position(self, step: int, last_version: int | None) -> None:
        """The step and (not None) last published version of a checkpoint."""
        self.step = step
        if last_version is not None:
            self.last_version = last_version

    # --- internals ------------------------------------------------------------------------

    def optimizer_for(self, adam: AdamParams) -> torch.optim.AdamW:
        """One AdamW for the model's life (its moments persist); each call may retune it."""
        hyper = {
            "lr": adam.lr,
            "betas": (adam.beta1, adam.beta2),
            "eps": adam.eps,
            "weight_decay": adam.weight_decay,
        }
        if self._optimizer is None:
            self._optimizer = torch.optim.AdamW(self.params, **hyper)
        else:
            for group in self._optimizer.param_groups:
                group.update(hyper)
        return self._optimizer

    def _load_base(self) -> PreTrainedModel:
        """The base model as this process trains it (on a rank: only its shards)."""
        return self.parallel.load(
            lambda: empty_causal_lm(self.model_path),
            lambda device: load_causal_lm(self.model_path, device),
            self.device,
        )

    def _loss(
        self, network: torch.nn.Module, batch: Batch, config: LossConfig, *, backward: bool
    ) -> tuple[float, dict[str, float], torch.Tensor]:
        """The loss on `batch` under `network`'s mode (train or eval), its metrics, and the
        per-token logprobs it was computed from, one micro-batch of rows of similar length at a
        time. Each micro-batch's share of the loss divides by the whole batch's totals, so with
        `backward` it is back-propagated at once and its graph freed: peak memory is one
        micro-batch's whatever the batch's size, and the gradients add up to the batch's."""
        training = network.training
        temperature = config.temperature
        reference = (
            self._reference_logprobs(network, batch, temperature) if config.kl_coef > 0 else None
        )
        network.train(training)  # the reference pass may have switched the mode
        totals = Totals.of(batch.loss_mask)
        groups = self._groups(batch)
        # One group fails, if it does, before its backward: nothing to undo then.
        undo = (
            _GradientUndo(self.params, self._has_gradients and len(groups) > 1)
            if backward
            else None
        )
        loss, metrics = 0.0, {}
        logprobs = torch.zeros_like(batch.loss_mask)
        for group in groups:
            rows = self.parallel.share(group)
            # No row of this micro-batch for this rank: a stand-in row, with no weight, runs
            # the passes the other ranks run.
            part, part_reference = batch.rows(rows or group[:1], reference)
            part_logprobs = self._forward(network, part.input_ids, part.attention_mask, temperature)
            share, shares = compute_loss(
                config,
                part_logprobs,
                part.loss_mask,
                old_logprobs=part.old_logprobs,
                advantages=part.advantages,
                ref_logprobs=part_reference,
                proximal_logprobs=part.proximal_logprobs,
                totals=totals,
            )
            if not rows:
                share, shares = share * 0.0, dict.fromkeys(shares, 0.0)
            if undo is not None:
                if not self.parallel.all_finite(share):
                    undo.restore()
                    raise InvalidInput(
                        f"The loss is {share.item()} (check advantages and logprobs for huge "
                        "or non-finite values); no gradients were accumulated"
                    )
                share.backward()
                undo.touched = True
            loss += share.item()
            for name, value in shares.items():
                metrics[name] = metrics.get(name, 0.0) + value
            if rows:
                index = torch.tensor(rows, device=logprobs.device)
                logprobs[index, : part_logprobs.shape[1]] = part_logprobs.detach()
        loss, metrics = self.parallel.sum_values(loss, metrics)
        return loss, metrics, logprobs

    def _logprobs(
        self, network: torch.nn.Module, batch: Batch, temperature: float = 1.0
    ) -> torch.Tensor:
        """[B, T] logprobs of this rank's rows, from one forward pass per micro-batch of rows
        of similar length (no graph is kept: callers run it without gradients)."""
        logprobs = torch.zeros(batch.input_ids.shape, device=batch.input_ids.device)
        for group in self._groups(batch):
            rows = self.parallel.share(group)
            part, _ = batch.rows(rows or group[:1])  # a stand-in row: see `_loss`
            part_logprobs = self._forward(network, part.input_ids, part.attention_mask, temperature)
            if rows:
                index = torch.tensor(rows, device=logprobs.device)
                logprobs[index, : part.input_ids.shape[1]] = part_logprobs
        return logprobs

    def _groups(self, batch: Batch) -> list[list[int]]:
        """The micro-batches' rows; a batch that fits in one keeps its own row order, so its
        loss is summed exactly as one pass over the batch sums it (bit for bit: a reordered
        sum differs in the last bits, which a long training run amplifies)."""
        groups = micro_batches(batch.lengths, self.micro_batch_tokens)
        return groups if len(groups) > 1 else [list(range(len(batch.lengths)))]

    @staticmethod
    def _forward(
        network: torch.nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        output = network(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        logits = output.logits if temperature == 1.0 else output.logits / temperature
        return token_logprobs(logits, input_ids)

    def _reference_logprobs(
        self, network: torch.nn.Module, batch: Batch, temperature: float
    ) -> torch.Tensor:
        """Logprobs under the base model: LoRA turns its adapter off; full training keeps a
        frozen copy of the base, loaded from disk on first use (the live weights have moved)."""
        with torch.no_grad():
            if isinstance(network, peft.PeftModel):
                network.eval()
                with network.disable_adapter():
                    return self._logprobs(network, batch, temperature)
            if self._frozen_reference is None:
                self._frozen_reference = self._load_base().eval()
                self._frozen_reference.requires_grad_(False)
            return self._logprobs(self._frozen_reference, batch, temperature)


def _held(tensors: list[torch.Tensor]) -> int:
    """Bytes of `tensors` in this process (a DTensor's local shard)."""
    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in local)


class _GradientUndo:
    """Puts the gradients back as they were before a forward_backward whose later micro-batch
    failed after earlier ones had added theirs. Gradients that were all None (the usual case:
    one forward_backward per step) cost nothing to keep."""

    def __init__(self, params: list[torch.nn.Parameter], has_gradients: bool) -> None:
        self.params = params
        self.saved = (
            [None if p.grad is None else p.grad.clone() for p in params]
            if has_gradients
            else [None] * len(params)
        )
        self.touched = False

    def restore(self) -> None:
        if self.touched:
            for param, grad in zip(self.params, self.saved, strict=True):
                param.grad = grad
