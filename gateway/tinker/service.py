"""Tinker's calls mapped onto Loom: a training model is a Loom job (its trainer model), a
sampler is a (job, version) pair served by rollout, `save_weights_for_sampler` publishes a
version. Training calls of one model reach the trainer in `seq_id` order, as the SDK numbers
them (from 1, no gaps), so the trainer's own per-model ordering keeps them in order."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker

from gateway import jobs
from gateway.keys import KeyIdentity
from gateway.schemas import JobCreate
from gateway.tinker import schemas, wire
from gateway.tinker.futures import Futures, Payload
from services.common.errors import (
    Forbidden,
    InvalidInput,
    NotFound,
    error_from_envelope,
    invalid_options,
)
from services.common.http import ServiceClient
from services.common.schemas import Operation, StrictModel
from services.rollout.schemas import SampleRequest, SampleResponse, SamplingParams
from services.trainer.schemas import (
    AdamParams,
    Datum,
    ForwardBackwardRequest,
    ForwardBackwardResult,
    ForwardRequest,
    ForwardResult,
    LoraConfig,
    LossAggregation,
    LossConfig,
    LossName,
    OptimStepRequest,
    SaveWeightsRequest,
    SaveWeightsResult,
    TrainingMode,
)

# Tinker's built-in losses that Loom's trainer computes the same way (token sums).
LOSSES = {"cross_entropy": LossName.cross_entropy,
          "importance_sampling": LossName.importance_sampling}
OPERATION_WAIT_S = 30.0
SEQ_GAP_TIMEOUT_S = 60.0
DEFAULT_MAX_TOKENS = 64


@dataclass
class TrainingModel:
    owner: int
    job_id: str
    base_model: str
    lora_rank: int
    next_seq: int = 1
    submitted: dict[int, str] = field(default_factory=dict)  # seq_id -> request id
    turn: asyncio.Condition = field(default_factory=asyncio.Condition)


@dataclass(frozen=True)
class SamplerRef:
    owner: int
    base_model: str
    job_id: str | None
    version: int
    model_path: str | None = None


@dataclass(frozen=True)
class TinkerDatum:
    tokens: np.ndarray
    inputs: dict[str, np.ndarray]


class TinkerService:
    def __init__(self, db: sessionmaker[Session], trainer: ServiceClient,
                 rollout: ServiceClient, base_models: dict[str, str]) -> None:
        self.db = db
        self.trainer = trainer
        self.rollout = rollout
        self.base_models = base_models
        self.futures = Futures()
        self.sessions: dict[str, int] = {}  # session id -> owner key id
        self.models: dict[str, TrainingModel] = {}
        self.samplers: dict[str, SamplerRef] = {}
        self.sampler_paths: dict[str, SamplerRef] = {}  # tinker://... -> what it names

    # --- sessions ---------------------------------------------------------------------

    def create_session(self, owner: KeyIdentity) -> str:
        session_id = f"loom-{uuid.uuid4().hex[:12]}"
        self.sessions[session_id] = owner.id
        return session_id

    def check_session(self, session_id: str, owner: KeyIdentity) -> None:
        if session_id not in self.sessions:
            raise NotFound(f"No session {session_id!r}: create one with create_session.")
        if not owner.admin and self.sessions[session_id] != owner.id:
            raise Forbidden(f"Session {session_id!r} belongs to another API key.")

    # --- training ---------------------------------------------------------------------

    def create_model(self, body: schemas.CreateModel, owner: KeyIdentity) -> dict[str, Any]:
        self.check_session(body.session_id, owner)
        model_id = f"{body.session_id}:train:{body.model_seq_id}"
        rank = (body.lora_config or schemas.LoraSpec()).rank
        base = self.base_models.get(body.base_model, body.base_model)
        job = JobCreate(name=f"tinker {model_id}", base_model=base, mode=TrainingMode.lora,
                        lora=LoraConfig(rank=rank, alpha=float(rank)),
                        config={"tinker_model_id": model_id, "tinker_base_model": body.base_model})

        async def create() -> Payload:
            created = await jobs.create_job(self.db, self.trainer, job, owner)
            self.models[model_id] = TrainingModel(owner.id, created.id, body.base_model, rank)
            return {"model_id": model_id, "type": "create_model"}

        return {"request_id": self.futures.submit(create()), "model_id": model_id}

    def model(self, model_id: str, owner: KeyIdentity) -> TrainingModel:
        model = self.models.get(model_id)
        if model is None:
            raise NotFound(f"No training model {model_id!r} (created with create_model in this "
                           "gateway's lifetime).")
        if not owner.admin and model.owner != owner.id:
            raise Forbidden(f"Model {model_id!r} belongs to another API key.")
        return model

    def get_info(self, model_id: str, owner: KeyIdentity) -> dict[str, Any]:
        model = self.model(model_id, owner)
        return {"type": "get_info", "model_id": model_id, "is_lora": True,
                "lora_rank": model.lora_rank, "model_name": model.base_model,
                "model_data": {"model_name": model.base_model, "arch": None,
                               "tokenizer_id": None}}

    async def forward_backward(self, body: bytes, owner: KeyIdentity) -> dict[str, Any]:
        request = wire.ForwardBackwardRequest()
        try:
            request.ParseFromString(body)
        except Exception as exc:  # protobuf's DecodeError and friends
            raise InvalidInput(f"forward_backward body is not a ForwardBackwardRequest: {exc}"
                               ) from exc
        model = self.model(request.model_id, owner)
        loss_name = LOSSES.get(request.loss_fn)
        if loss_name is None:
            raise InvalidInput(f"Loss {request.loss_fn!r} is not served by Loom; supported: "
                               f"{', '.join(LOSSES)}.")
        data = [tinker_datum(d, i) for i, d in enumerate(request.data)]
        with user_input("forward_backward", "data"):
            loom_data = [loom_datum(d, request.loss_fn, i) for i, d in enumerate(data)]
            forward_body = ForwardRequest(data=loom_data)
            backward_body = ForwardBackwardRequest(
                data=loom_data, loss=LossConfig(name=loss_name, aggregation=LossAggregation.sum))
        job = model.job_id

        async def submit() -> Any:
            forward = await self._submit(job, "forward", forward_body)
            if request.forward_only:
                return forward, None
            return forward, await self._submit(job, "forward_backward", backward_body)

        async def result(ops: Any) -> Payload:
            forward_op, backward_op = ops
            forward = ForwardResult.model_validate(await self._result(forward_op))
            logprobs = [row[1:] for row in forward.logprobs]  # position i predicts target i
            if backward_op is None:
                total = sum(forward_loss(request.loss_fn, d, lp) for d, lp in
                            zip(data, logprobs, strict=True))
            else:
                total = ForwardBackwardResult.model_validate(await self._result(backward_op)).loss
            return wire.forward_backward_output(logprobs, {"loss:sum": float(total)})

        return await self._in_order(model, request.seq_id, submit, result)

    async def optim_step(self, body: schemas.OptimStep, owner: KeyIdentity) -> dict[str, Any]:
        model = self.model(body.model_id, owner)
        spec = body.adam_params
        with user_input("optim_step", "adam_params"):
            step = OptimStepRequest(adam=AdamParams(
                lr=spec.learning_rate, beta1=spec.beta1, beta2=spec.beta2, eps=spec.eps,
                weight_decay=spec.weight_decay, grad_clip=spec.grad_clip_norm or None))

        async def submit() -> str:
            return await self._submit(model.job_id, "optim_step", step)

        async def result(op: str) -> Payload:
            done = await self._result(op)
            return {"metrics": {"grad_norm:mean": float(done["grad_norm"])}}

        return await self._in_order(model, body.seq_id, submit, result)

    async def save_for_sampler(self, body: schemas.SaveForSampler, owner: KeyIdentity
                               ) -> dict[str, Any]:
        model = self.model(body.model_id, owner)
        if body.path is None and body.sampling_session_seq_id is None:
            raise InvalidInput("save_weights_for_sampler needs a path or a "
                               "sampling_session_seq_id.")

        async def submit() -> str:
            return await self._submit(model.job_id, "save_weights", SaveWeightsRequest())

        async def result(op: str) -> Payload:
            saved = SaveWeightsResult.model_validate(await self._result(op))
            ref = SamplerRef(model.owner, model.base_model, model.job_id, saved.number)
            if body.path is not None:
                path = f"tinker://{body.model_id}/sampler_weights/{body.path}"
                self.sampler_paths[path] = ref
                return {"path": path, "type": "save_weights_for_sampler"}
            session = body.model_id.split(":", 1)[0]
            sampler_id = f"{session}:sample:{body.sampling_session_seq_id}"
            self.samplers[sampler_id] = ref
            return {"path": None, "sampling_session_id": sampler_id,
                    "type": "save_weights_for_sampler"}

        return await self._in_order(model, body.seq_id, submit, result)

    # --- sampling ---------------------------------------------------------------------

    def create_sampling_session(self, body: schemas.CreateSamplingSession,
                                owner: KeyIdentity) -> dict[str, Any]:
        self.check_session(body.session_id, owner)
        if body.model_path is not None:
            ref = self.sampler_paths.get(body.model_path)
            if ref is None:
                raise NotFound(f"No sampler weights at {body.model_path!r}: save them with "
                               "save_weights_for_sampler(name) first.")
        elif body.base_model is not None:
            ref = SamplerRef(owner.id, body.base_model, None, 0)
        else:
            raise InvalidInput("create_sampling_session needs a base_model or a model_path.")
        sampler_id = f"{body.session_id}:sample:{body.sampling_session_seq_id}"
        self.samplers[sampler_id] = SamplerRef(owner.id, ref.base_model, ref.job_id,
                                               ref.version, body.model_path)
        return {"sampling_session_id": sampler_id, "type": "create_sampling_session"}

    def sampler(self, sampler_id: str, owner: KeyIdentity) -> SamplerRef:
        ref = self.samplers.get(sampler_id)
        if ref is None:
            raise NotFound(f"No sampler {sampler_id!r}.")
        if not owner.admin and ref.owner != owner.id:
            raise Forbidden(f"Sampler {sampler_id!r} belongs to another API key.")
        return ref

    def sample(self, body: schemas.Sample, owner: KeyIdentity) -> dict[str, Any]:
        ref = self.sampler(body.sampling_session_id, owner)
        if body.prompt_logprobs or body.topk_prompt_logprobs or body.topk_sample_logprobs:
            raise InvalidInput("Prompt logprobs and top-k logprobs (compute_logprobs, "
                               "topk_*) are not served by Loom yet.")
        if any(chunk.type != "encoded_text" for chunk in body.prompt.chunks):
            raise InvalidInput("Only text prompts (encoded_text chunks) are supported.")
        with user_input("asample", "sampling_params"):
            params = sampling_params(body.sampling_params)
            # vLLM refuses n > 1 when greedy; greedy samples are all the same one anyway.
            greedy_copies = body.num_samples if params.temperature == 0 else 1
            request = SampleRequest(
                job_id=ref.job_id, version=ref.version, n=body.num_samples // greedy_copies,
                prompt_token_ids=[t for chunk in body.prompt.chunks for t in chunk.tokens],
                params=params)

        async def run() -> Payload:
            response = SampleResponse.model_validate(await self.rollout.post_json(
                "/v1/sample", request.model_dump(mode="json")))
            return wire.sample_response([(s.token_ids, s.logprobs, s.stop_reason == "length")
                                         for s in response.samples] * greedy_copies)

        ids = [f"{body.sampling_session_id}:{body.seq_id}:{i}" for i in range(body.num_samples)]
        return {"request_id": self.futures.submit(run()), "sample_sequence_ids": ids}

    # --- plumbing ---------------------------------------------------------------------

    async def _in_order(self, model: TrainingModel, seq_id: int, submit: Any, result: Any
                        ) -> dict[str, Any]:
        """Submit to the trainer when it is `seq_id`'s turn; a resent seq_id (the SDK's retry)
        gets the first submission's request id."""
        async with model.turn:
            if seq_id in model.submitted:
                return {"request_id": model.submitted[seq_id]}
            try:
                await asyncio.wait_for(model.turn.wait_for(lambda: model.next_seq >= seq_id),
                                       SEQ_GAP_TIMEOUT_S)
            except TimeoutError as exc:
                raise InvalidInput(f"seq_id {seq_id} waited {SEQ_GAP_TIMEOUT_S:g} s for "
                                   f"seq_id {model.next_seq}, which never came.") from exc
            try:
                submitted = await submit()
            finally:
                model.next_seq = max(model.next_seq, seq_id + 1)
                model.turn.notify_all()
            request_id = self.futures.submit(result(submitted))
            model.submitted[seq_id] = request_id
            return {"request_id": request_id}

    async def _submit(self, job_id: str, action: str, body: StrictModel) -> str:
        op = Operation.model_validate(await self.trainer.post_json(
            f"/v1/models/{job_id}/{action}", body.model_dump(mode="json")))
        return op.id

    async def _result(self, op_id: str) -> Any:
        while True:
            op = Operation.model_validate(await self.trainer.get_json(
                f"/v1/operations/{op_id}", params={"wait": OPERATION_WAIT_S}))
            if op.error is not None:
                raise error_from_envelope(400, {"error": op.error.model_dump()})
            if op.done:
                return op.result


@contextmanager
def user_input(call: str, root: str) -> Iterator[None]:
    """What the caller sent, checked by Loom's own schemas: a 4xx naming each bad field."""
    try:
        yield
    except ValidationError as exc:
        raise invalid_options(exc, f"Invalid {call} request", root) from exc


def tinker_datum(datum: Any, index: int) -> TinkerDatum:
    chunks = list(datum.model_input)
    if any(not chunk.HasField("encoded_text") for chunk in chunks):
        raise InvalidInput(f"data[{index}]: only text model inputs (encoded_text) are supported.")
    tokens = np.concatenate([np.frombuffer(c.encoded_text.tokens, "<i4") for c in chunks]
                            ) if chunks else np.zeros(0, "<i4")
    inputs = {}
    for name, tensor in datum.loss_fn_inputs.items():
        if tensor.HasField("sparse_csr"):
            raise InvalidInput(f"data[{index}].{name}: sparse tensors are not supported.")
        inputs[name] = wire.tensor_values(tensor)
    return TinkerDatum(tokens, inputs)


def loom_datum(datum: TinkerDatum, loss_fn: str, index: int) -> Datum:
    """Tinker: input t[0..T-1], targets t[1..T] (position i predicts target i). Loom: one
    sequence t[0..T], position i predicting token i, so every per-token list shifts by one."""
    targets = datum.inputs.get("target_tokens")
    n = len(datum.tokens)
    if targets is None or len(targets) != n or n == 0:
        raise InvalidInput(f"data[{index}]: target_tokens must have one entry per input token "
                           f"({n}).")
    if not np.array_equal(targets[:-1], datum.tokens[1:]):
        raise InvalidInput(f"data[{index}]: target_tokens must be the input shifted by one "
                           "(input[1:] + [next token]); other targets are not supported.")
    weights = per_token(datum, "weights", index, default=1.0)
    ids = [int(t) for t in datum.tokens] + [int(targets[-1])]
    if loss_fn == "cross_entropy":
        return Datum(input_ids=ids, loss_mask=[0.0, *weights])
    return Datum(input_ids=ids, loss_mask=[0.0] + [1.0] * n,
                 advantages=[0.0, *per_token(datum, "advantages", index)],
                 logprobs=[0.0, *per_token(datum, "logprobs", index)])


def per_token(datum: TinkerDatum, name: str, index: int, default: float | None = None
              ) -> list[float]:
    values = datum.inputs.get(name)
    n = len(datum.tokens)
    if values is None:
        if default is None:
            raise InvalidInput(f"data[{index}]: this loss needs loss_fn_inputs[{name!r}].")
        return [default] * n
    if len(values) != n:
        raise InvalidInput(f"data[{index}].{name} has {len(values)} entries; the input has {n}.")
    return [float(v) for v in values]


def forward_loss(loss_fn: str, datum: TinkerDatum, logprobs: list[float]) -> float:
    """The loss `forward` reports, from the logprobs it computed (no gradient)."""
    lp = np.asarray(logprobs)
    if loss_fn == "cross_entropy":
        return float(-(np.asarray(per_token(datum, "weights", 0, 1.0)) * lp).sum())
    ratio = np.exp(lp - np.asarray(per_token(datum, "logprobs", 0)))
    return float(-(ratio * np.asarray(per_token(datum, "advantages", 0))).sum())


def sampling_params(params: schemas.TinkerSamplingParams) -> SamplingParams:
    stop = params.stop
    strings = [stop] if isinstance(stop, str) else [s for s in stop or [] if isinstance(s, str)]
    token_ids = [s for s in stop or [] if isinstance(s, int)] if not isinstance(stop, str) \
        else []
    return SamplingParams(max_tokens=params.max_tokens or DEFAULT_MAX_TOKENS,
                          temperature=params.temperature, top_p=params.top_p,
                          top_k=params.top_k, seed=params.seed, stop=strings,
                          stop_token_ids=token_ids)
