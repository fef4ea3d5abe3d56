"""What the SDK protocols the gateway serves (Tinker, Weaver) share: training calls reach
Loom's trainer as operations, in the order the SDK numbered them (`seq_id`), and a call sent
twice (an SDK's retry after a lost answer) is one call; samples come from rollout."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

import numpy as np
from pydantic import ValidationError

from gateway.auth.keys import KeyIdentity
from gateway.compat.common.futures import Futures, Payload
from services.common.errors import (
    Forbidden,
    InvalidInput,
    LoomError,
    NotFound,
    invalid_options,
)
from services.common.schemas import StrictModel
from services.rollout.client import RolloutClient
from services.rollout.schemas import (
    MAX_TOP_LOGPROBS,
    SampleRequest,
    SampleResponse,
    SamplingParams,
)
from services.trainer.client import TrainerClient
from services.trainer.schemas import (
    AdamParams,
    Datum,
    ForwardBackwardRequest,
    ForwardRequest,
    ForwardResult,
    LossAggregation,
    LossConfig,
    LossName,
    OptimStepRequest,
)

SEQ_GAP_TIMEOUT_S = 60.0
TURN_POLL_S = 0.5  # how often a call waiting for its turn looks for numbers used elsewhere
# The SDKs' built-in losses Loom's trainer computes, as token sums (their convention), with
# the `loss_fn_config` keys each reads and their defaults (clip thresholds bound the ratio).
BUILTIN_LOSSES: dict[str, tuple[LossName, dict[str, float]]] = {
    "cross_entropy": (LossName.cross_entropy, {}),
    "importance_sampling": (LossName.importance_sampling, {}),
    "ppo": (LossName.ppo, {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    "cispo": (LossName.cispo, {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}),
    "dro": (LossName.dro, {"beta": 0.05}),
}
# A loss an SDK computes on the client (its custom loss) reaches the trainer as its gradient
# with respect to each target's logprob, g: -sum(-g * logprob) has exactly that gradient.
CLIENT_LOSS = LossConfig(name=LossName.reinforce, aggregation=LossAggregation.sum)


def expiry(ttl_seconds: int | None) -> datetime | None:
    """When a checkpoint saved now with this TTL (an SDK's `ttl_seconds`) expires; None:
    never."""
    return None if ttl_seconds is None else datetime.now(UTC) + timedelta(seconds=ttl_seconds)


class Owned(Protocol):
    @property
    def owner(self) -> str | None: ...


OwnedT = TypeVar("OwnedT", bound=Owned)


def owned(
    item: OwnedT | None, item_id: str, viewer: KeyIdentity, what: str, missing: str = ""
) -> OwnedT:
    """A session, model or sampler (None: not found) that `viewer` may use."""
    if item is None:
        raise NotFound(f"No {what.lower()} {item_id!r}{missing}.")
    if not viewer.admin and item.owner != viewer.id:
        raise Forbidden(f"{what} {item_id!r} belongs to another API key.")
    return item


class TrainerCalls:
    """Operations on Loom's trainer: submit one (under an idempotency key, so a lost answer
    is sent again safely), then wait for its result."""

    def __init__(self, trainer: TrainerClient) -> None:
        self.trainer = trainer

    async def submit(self, job_id: str, action: str, body: StrictModel) -> str:
        return (await self.trainer.submit(action, job_id, body)).id

    async def result(self, op_id: str) -> Any:
        return await self.trainer.result(op_id)

    async def run(self, job_id: str, action: str, body: StrictModel) -> Any:
        return await self.result(await self.submit(job_id, action, body))


@dataclass
class CallOrder:
    """One training model's calls, numbered by its SDK from 1 without gaps. `next_seq` 0:
    not known (a model this replica has not seen a call of yet), the first call sets it.
    Every number is used up whatever happens to its call: submitted, failed on submission,
    or refused before it (`skip`), so one refused call never stalls the calls after it.
    Numbers are used up in the database too (`Futures.claim`, `Futures.mark_used`) before a
    call reaches the trainer: a call resent to another gateway replica is the first one, not
    a second, and a call waiting for numbers another replica used finds them there."""

    model_id: str
    next_seq: int = 1
    submitted: dict[int, str] = field(default_factory=dict)  # seq_id -> call id
    skipped: set[int] = field(default_factory=set)  # refused, not yet reached
    turn: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def place(
        self,
        futures: Futures,
        seq_id: int | None,
        submit: Callable[[], Awaitable[Any]],
        result: Callable[[Any], Awaitable[Payload]],
    ) -> str:
        """Submit to the trainer when it is `seq_id`'s turn (None: at once, in arrival order)
        and return the call id whose result `result(submitted)` gives. A resent seq_id gets
        the first submission's call id. `submit` raising (a refused call) uses the number up
        too, and its error is the caller's."""
        async with self.turn:
            if seq_id is None:
                return await futures.submit(result(await submit()))
            if seq_id in self.submitted:
                return self.submitted[seq_id]
            if self.next_seq == 0:
                self.next_seq = seq_id
            await self._await_turn(futures, seq_id)
            try:
                call_id, first = await futures.claim(self.model_id, seq_id)
                if first:
                    try:
                        submitted = await submit()
                    except BaseException:
                        await futures.release(call_id)
                        raise
                    await futures.submit(result(submitted), call_id)
            finally:
                self._used(seq_id)
            self.submitted[seq_id] = call_id
            return call_id

    async def _await_turn(self, futures: Futures, seq_id: int) -> None:
        """Until the numbers before `seq_id` are used up, here or by another replica."""
        deadline = time.monotonic() + SEQ_GAP_TIMEOUT_S
        while self.next_seq < seq_id:
            with suppress(TimeoutError):
                await asyncio.wait_for(
                    self.turn.wait_for(lambda: self.next_seq >= seq_id), TURN_POLL_S
                )
            if self.next_seq < seq_id:  # the calls before it may have reached other replicas
                self.skipped |= await futures.used(self.model_id, self.next_seq, seq_id)
                self._advance()
            if self.next_seq < seq_id and time.monotonic() >= deadline:
                raise InvalidInput(
                    f"seq_id {seq_id} waited {SEQ_GAP_TIMEOUT_S:g} s for "
                    f"seq_id {self.next_seq}, which never came."
                )

    async def skip(self, futures: Futures, seq_id: int | None) -> None:
        """`seq_id`'s call was refused before it could take its turn: its number is used up
        (at once, or when the calls before it have had theirs)."""
        if seq_id is None:
            return
        async with self.turn:
            if seq_id in self.submitted or 0 < seq_id < self.next_seq:
                return
            await futures.mark_used(self.model_id, seq_id)
            if self.next_seq == 0 or self.next_seq == seq_id:
                self._used(seq_id)
            else:
                self.skipped.add(seq_id)

    def _used(self, seq_id: int) -> None:
        self.next_seq = max(self.next_seq, seq_id + 1)
        self._advance()

    def _advance(self) -> None:
        while self.next_seq in self.skipped:
            self.skipped.discard(self.next_seq)
            self.next_seq += 1
        self.turn.notify_all()


Numbering = Callable[..., tuple[str | None, int | None]]
CallT = TypeVar("CallT", bound=Callable[..., Awaitable[Any]])


def numbered(numbering: Numbering) -> Callable[[CallT], CallT]:
    """Marks a service method as a numbered training call: when it is refused (any Loom
    error, before or at its turn), the model's number for it is used up, so the SDK's next
    call proceeds at once. `numbering(*args)` gives the model's key in `self.models` and the
    seq_id from the method's arguments, given as the method was called (None where they
    cannot be read)."""

    def wrap(method: CallT) -> CallT:
        @functools.wraps(method)
        async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return await method(self, *args, **kwargs)
            except LoomError:
                model_id, seq_id = numbering(*args, **kwargs)
                model = self.models.get(model_id) if model_id is not None else None
                if model is not None:
                    await model.calls.skip(self.futures, seq_id)
                raise

        return call  # type: ignore[return-value]

    return wrap


def check_shifted_targets(
    tokens: np.ndarray, targets: np.ndarray, carries_loss: np.ndarray, index: int
) -> None:
    """Loom trains a sequence on its input shifted by one: both SDKs' `target_tokens` must be
    `tokens[1:]` (then the next token) wherever a target carries loss; elsewhere (padding:
    weight 0, advantage 0, -100) any target is taken. A 4xx names the first that is not."""
    wrong = np.flatnonzero((targets[:-1] != tokens[1:]) & carries_loss[:-1])
    if wrong.size:
        at = int(wrong[0])
        raise InvalidInput(
            f"data[{index}]: target_tokens[{at}] is {int(targets[at])}, not the next input "
            f"token {int(tokens[at + 1])}: Loom trains on the input shifted by one, and takes "
            "another target only where it carries no loss (weight or advantage 0, or -100).",
            {"index": index, "position": at},
        )


@contextmanager
def user_input(call: str, root: str) -> Iterator[None]:
    """What the caller sent, checked by Loom's own schemas: a 4xx naming each bad field."""
    try:
        yield
    except ValidationError as exc:
        raise invalid_options(exc, f"Invalid {call} request", root) from exc


class AdamSpec(Protocol):
    """Both SDKs' Adam parameters (their own defaults, the same names)."""

    learning_rate: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    grad_clip_norm: float


def optim_step_request(spec: AdamSpec) -> OptimStepRequest:
    """An SDK's optimizer step as Loom's; a grad_clip_norm of 0 means no clipping."""
    with user_input("optim_step", "adam_params"):
        return OptimStepRequest(
            adam=AdamParams(
                lr=spec.learning_rate,
                beta1=spec.beta1,
                beta2=spec.beta2,
                eps=spec.eps,
                weight_decay=spec.weight_decay,
                grad_clip=spec.grad_clip_norm or None,
            )
        )


def builtin_loss(loss_fn: str, config: dict[str, Any]) -> LossConfig:
    """An SDK's loss name and `loss_fn_config` as Loom's loss, or a 4xx saying what is
    served."""
    if loss_fn not in BUILTIN_LOSSES:
        raise InvalidInput(
            f"Loss {loss_fn!r} is not served by Loom; supported: {', '.join(BUILTIN_LOSSES)}."
        )
    name, defaults = BUILTIN_LOSSES[loss_fn]
    unknown = set(config) - set(defaults)
    if unknown:
        raise InvalidInput(
            f"loss_fn_config keys {sorted(unknown)} are not served for "
            f"{loss_fn!r}" + (f"; it reads {sorted(defaults)}." if defaults else ".")
        )
    values = {**defaults, **config}
    options: dict[str, float] = {}
    try:
        if "beta" in values:
            options["dro_beta"] = float(values["beta"])
        if "clip_low_threshold" in values:
            options.update(
                clip_low=1 - float(values["clip_low_threshold"]),
                clip_high=float(values["clip_high_threshold"]) - 1,
            )
        return LossConfig(name=name, aggregation=LossAggregation.sum, **options)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(
            f"loss_fn_config {values} is out of range for {loss_fn!r}: "
            "clip_low_threshold must be in [0, 1], clip_high_threshold in "
            "[1, 11] and beta above 0."
        ) from exc


def client_loss_datum(
    ids: list[int], gradient: list[float], mask: list[float] | None = None
) -> Datum:
    """Loom's datum for `CLIENT_LOSS`: `gradient[i]` is the client loss's derivative by the
    logprob of ids[i + 1]; `mask` (default all 1) drops positions that have no target."""
    return Datum(
        input_ids=ids,
        loss_mask=[0.0, *(mask or [1.0] * len(gradient))],
        advantages=[0.0, *(-g for g in gradient)],
    )


@dataclass(frozen=True)
class TrainingPass:
    """An SDK's forward or forward_backward as one trainer call; either answers per-token
    logprobs and, given a loss, its value (`ForwardResult`'s fields)."""

    action: str
    body: ForwardRequest | ForwardBackwardRequest

    @classmethod
    def of(
        cls, call: str, data: list[Datum], loss: LossConfig | None, *, backward: bool
    ) -> TrainingPass:
        with user_input(call, "data"):
            if backward:
                if loss is None:
                    raise InvalidInput(f"{call} needs a loss.")
                return cls(
                    "forward_backward",
                    ForwardBackwardRequest(data=data, loss=loss, return_logprobs=True),
                )
            return cls("forward", ForwardRequest(data=data, loss=loss))

    async def submit(self, calls: TrainerCalls, job_id: str) -> str:
        return await calls.submit(job_id, self.action, self.body)

    @staticmethod
    async def result(calls: TrainerCalls, op_id: str) -> ForwardResult:
        return ForwardResult.model_validate(await calls.result(op_id))


def check_top_k(**asked: int) -> None:
    """A 4xx naming the SDK's own field when it asks for more top-k logprobs than vLLM keeps."""
    for name, k in asked.items():
        if not 0 <= k <= MAX_TOP_LOGPROBS:
            raise InvalidInput(f"{name} must be between 0 and {MAX_TOP_LOGPROBS} (got {k}).")


@dataclass(frozen=True)
class Scoring:
    """What a sample call reports besides the sampled tokens' own logprobs."""

    prompt_logprobs: bool = False
    top_logprobs: int = 0  # the k most likely tokens at each sampled position
    prompt_top_logprobs: int = 0  # ... and at each prompt position


async def sample(
    rollout: RolloutClient,
    job_id: str | None,
    version: int,
    prompt_token_ids: list[int],
    n: int,
    params: SamplingParams,
    scoring: Scoring = Scoring(),
) -> SampleResponse:
    """`n` samples of `prompt_token_ids` from one version of a job (None: the base model),
    and the prompt's own logprobs if asked."""
    # vLLM refuses n > 1 when greedy; greedy samples are all the same one anyway.
    copies = n if params.temperature == 0 else 1
    with user_input("sample", "sampling_params"):
        request = SampleRequest(
            job_id=job_id,
            version=version,
            n=n // copies,
            prompt_token_ids=prompt_token_ids,
            params=params,
            prompt_logprobs=scoring.prompt_logprobs,
            top_logprobs=scoring.top_logprobs,
            prompt_top_logprobs=scoring.prompt_top_logprobs,
        )
    response = await rollout.sample(request)
    response.samples *= copies
    return response
