"""Tinker's calls mapped onto Loom: a training model is a Loom job (its trainer model), a
sampler is a (job, version) pair served by rollout, `save_weights_for_sampler` publishes a
version, `save_state` / `load_state` save and restore the job's trainer checkpoints
(`checkpoints`). Training calls of one model reach the trainer in `seq_id` order, as the SDK
numbers them (from 1, no gaps), so the trainer's own per-model ordering keeps them in order."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from gateway.auth.keys import KeyIdentity
from gateway.compat.common.base_models import ServedModels
from gateway.compat.common.calls import (
    CallOrder,
    Scoring,
    TrainerCalls,
    TrainingPass,
    check_top_k,
    expiry,
    numbered,
    optim_step_request,
    owned,
    sample,
    user_input,
)
from gateway.compat.common.futures import Futures, Payload
from gateway.compat.common.state import SamplerRef, SdkState
from gateway.compat.tinker import checkpoints, schemas, wire
from gateway.compat.tinker.convert import loom_batch, sampling_params, tinker_datum
from gateway.jobs import jobs
from gateway.models import JobRow
from gateway.schemas import JobCreate, JobStatus
from services.common.base_models import resolve_base_model
from services.common.db import in_transaction
from services.common.errors import (
    Conflict,
    InvalidInput,
    LoomError,
    NotFound,
)
from services.rollout.client import RolloutClient
from services.trainer.client import TrainerClient
from services.trainer.schemas import (
    LoadStateRequest,
    SaveStateRequest,
    SaveWeightsRequest,
    SaveWeightsResult,
    StateCheckpoint,
    TrainingMode,
)

T = TypeVar("T")


@dataclass
class TrainingModel:
    owner: str | None
    job_id: str
    base_model: str
    lora_rank: int
    tokenizer_id: str  # the base model's directory on this host, for the SDK's get_tokenizer
    calls: CallOrder


class TinkerService:
    def __init__(
        self,
        db: sessionmaker[Session],
        trainer: TrainerClient,
        rollout: RolloutClient,
        base_models: dict[str, str],
        data_dir: Path,
    ) -> None:
        self.db = db
        self.data_dir = data_dir
        self.trainer = trainer
        self.rollout = rollout
        self.served = ServedModels(rollout, base_models)
        self.futures = Futures(db, "req")
        self.calls = TrainerCalls(trainer)
        self.state = SdkState(db, "tinker")  # sessions, samplers, named sampler weights
        self.models: dict[str, TrainingModel] = {}  # those this replica has served

    # --- sessions ---------------------------------------------------------------------

    async def create_session(self, owner: KeyIdentity) -> str:
        session_id = f"loom-{uuid.uuid4().hex[:12]}"
        await self.state.add_session(session_id, owner)
        return session_id

    async def check_session(self, session_id: str, owner: KeyIdentity) -> None:
        owned(
            await self.state.session(session_id),
            session_id,
            owner,
            "Session",
            ": create one with create_session",
        )

    # --- training ---------------------------------------------------------------------

    async def create_model(self, body: schemas.CreateModel, owner: KeyIdentity) -> schemas.Future:
        await self.check_session(body.session_id, owner)
        model_id = f"{body.session_id}:train:{body.model_seq_id}"
        rank = (body.lora_config or schemas.LoraSpec()).rank
        base = await self.served.check(body.base_model, "A LoRA training client")
        job = JobCreate(
            name=checkpoints.job_name(model_id),
            base_model=base,
            mode=TrainingMode.lora,
            lora=checkpoints.lora_for_rank(rank),
            config={"tinker_model_id": model_id, "tinker_base_model": body.base_model},
        )

        async def create() -> Payload:
            created = await jobs.create_job(self.db, self.trainer, job, owner)
            self.models[model_id] = TrainingModel(
                owner.id,
                created.id,
                body.base_model,
                rank,
                await self.tokenizer_id(base),
                CallOrder(model_id),
            )
            return {"model_id": model_id, "type": "create_model"}

        return schemas.Future(request_id=await self.futures.submit(create()), model_id=model_id)

    async def tokenizer_id(self, loom_base_model: str) -> str:
        return await run_in_threadpool(resolve_base_model, loom_base_model, self.data_dir)

    async def model(self, model_id: str, owner: KeyIdentity) -> TrainingModel:
        """A model this replica has served, else found by its job (made through another
        replica, or before a restart): its calls go on in the SDK's numbering."""
        if model_id not in self.models:

            def lookup() -> tuple[checkpoints.TrainingRun, JobRow] | None:
                with self.db() as session:
                    run = checkpoints.run_of_job(session, model_id, owner)
                    return (
                        None if run is None else (run, jobs.get_job_row(session, run.job_id, owner))
                    )

            found = await run_in_threadpool(lookup)
            if found is None:
                raise NotFound(f"No model {model_id!r} (or it belongs to another API key).")
            run, job = found
            self.models.setdefault(
                model_id,
                TrainingModel(
                    job.owner_key_id,
                    run.job_id,
                    run.base_model,
                    run.lora.rank,
                    await self.tokenizer_id(job.base_model),
                    CallOrder(model_id, next_seq=0),
                ),
            )
        return owned(self.models.get(model_id), model_id, owner, "Model")

    async def get_info(self, model_id: str, owner: KeyIdentity) -> schemas.ModelInfo:
        model = await self.model(model_id, owner)
        return schemas.ModelInfo(
            model_id=model_id,
            lora_rank=model.lora_rank,
            model_name=model.base_model,
            model_data=schemas.ModelData(
                model_name=model.base_model, tokenizer_id=model.tokenizer_id
            ),
        )

    @numbered(lambda body, _owner: wire.numbering(body))
    async def forward_backward(self, body: bytes, owner: KeyIdentity) -> schemas.Future:
        request = wire.ForwardBackwardRequest()
        try:
            request.ParseFromString(body)
        except Exception as exc:  # protobuf's DecodeError and friends
            raise InvalidInput(
                f"forward_backward body is not a ForwardBackwardRequest: {exc}"
            ) from exc
        model = await self.model(request.model_id, owner)
        config = {name: value.number for name, value in request.loss_fn_config_v2.items()}
        data = [tinker_datum(d, i) for i, d in enumerate(request.data)]
        with user_input("forward_backward", "data"):
            loom_data, loss = loom_batch(
                data, request.loss_fn, {**request.loss_fn_config, **config}
            )
        training = TrainingPass.of(
            "forward_backward", loom_data, loss, backward=not request.forward_only
        )
        job = model.job_id

        async def submit() -> str:
            return await training.submit(self.calls, job)

        async def result(op: str) -> Payload:
            done = await training.result(self.calls, op)
            logprobs = [row[1:] for row in done.logprobs]  # position i predicts target i
            return wire.forward_backward_output(logprobs, {"loss:sum": float(done.loss or 0)})

        return await self._in_order(model, request.seq_id, submit, result)

    @numbered(lambda body, _owner: (body.model_id, body.seq_id))
    async def optim_step(self, body: schemas.OptimStep, owner: KeyIdentity) -> schemas.Future:
        model = await self.model(body.model_id, owner)
        step = optim_step_request(body.adam_params)

        async def submit() -> str:
            return await self.calls.submit(model.job_id, "optim_step", step)

        async def result(op: str) -> Payload:
            done = await self.calls.result(op)
            return {"metrics": {"grad_norm:mean": float(done["grad_norm"])}}

        return await self._in_order(model, body.seq_id, submit, result)

    @numbered(lambda body, _owner: (body.model_id, body.seq_id))
    async def save_for_sampler(
        self, body: schemas.SaveForSampler, owner: KeyIdentity
    ) -> schemas.Future:
        model = await self.model(body.model_id, owner)
        if body.path is None and body.sampling_session_seq_id is None:
            raise InvalidInput(
                "save_weights_for_sampler needs a path or a sampling_session_seq_id."
            )

        async def submit() -> str:
            return await self.calls.submit(model.job_id, "save_weights", SaveWeightsRequest())

        async def result(op: str) -> Payload:
            saved = SaveWeightsResult.model_validate(await self.calls.result(op))
            ref = SamplerRef(
                model.owner,
                model.base_model,
                model.job_id,
                saved.number,
                expires_at=expiry(body.ttl_seconds),
            )
            if body.path is not None:
                path = f"tinker://{body.model_id}/sampler_weights/{body.path}"
                await self.state.add_weights(path, ref)
                return {"path": path, "type": "save_weights_for_sampler"}
            session = body.model_id.split(":", 1)[0]
            sampler_id = f"{session}:sample:{body.sampling_session_seq_id}"
            await self.state.add_sampler(sampler_id, ref)
            return {
                "path": None,
                "sampling_session_id": sampler_id,
                "type": "save_weights_for_sampler",
            }

        return await self._in_order(model, body.seq_id, submit, result)

    # --- training state ---------------------------------------------------------------

    @numbered(lambda body, _owner: (body.model_id, body.seq_id))
    async def save_state(self, body: schemas.SaveState, owner: KeyIdentity) -> schemas.Future:
        model = await self.model(body.model_id, owner)

        async def submit() -> str:
            request = SaveStateRequest(
                name=checkpoints.checkpoint_name(body.path), expires_at=expiry(body.ttl_seconds)
            )
            return await self.calls.submit(model.job_id, "save_state", request)

        async def result(op: str) -> Payload:
            try:
                saved = StateCheckpoint.model_validate(await self.calls.result(op))
            except Conflict as exc:
                if body.overwrite:
                    raise Conflict(
                        f"{exc.message} (overwrite=True is not served: Loom keeps "
                        "every checkpoint; save under a new name.)"
                    ) from exc
                raise
            path = checkpoints.TinkerPath(body.model_id, checkpoints.WEIGHTS, saved.name)
            return {"path": str(path), "type": "save_weights"}

        return await self._in_order(model, body.seq_id, submit, result)

    @numbered(lambda body, _owner: (body.model_id, body.seq_id))
    async def load_state(self, body: schemas.LoadState, owner: KeyIdentity) -> schemas.Future:
        if body.model_id is not None and body.seq_id is not None:
            return await self._load_into(body, body.model_id, body.seq_id, owner)
        if body.session_id is not None and body.model_seq_id is not None:
            return await self._create_from_state(body, body.session_id, body.model_seq_id, owner)
        raise InvalidInput(
            "load_weights needs a model_id and a seq_id (load_state) or a "
            "session_id and a model_seq_id (create_training_client_from_state)."
        )

    async def _load_into(
        self, body: schemas.LoadState, model_id: str, seq_id: int, owner: KeyIdentity
    ) -> schemas.Future:
        """load_state / load_state_with_optimizer, in the model's order of calls."""
        model = await self.model(model_id, owner)

        async def submit() -> str:
            path = checkpoints.training_path(body.path)
            name = checkpoints.checkpoint_name(path.name)
            source = await self.training_run(path.model_id, owner)
            return await self.calls.submit(
                model.job_id,
                "load_state",
                LoadStateRequest(
                    name=name,
                    job_id=None if source.job_id == model.job_id else source.job_id,
                    optimizer=body.optimizer,
                ),
            )

        async def result(op: str) -> Payload:
            await self.calls.result(op)
            return {"path": body.path, "model_id": model_id, "type": "load_weights"}

        return await self._in_order(model, seq_id, submit, result)

    async def _create_from_state(
        self, body: schemas.LoadState, session_id: str, model_seq_id: int, owner: KeyIdentity
    ) -> schemas.Future:
        """create_training_client_from_state(_with_optimizer): a new job with the source's
        LoRA, its model loaded with the source job's checkpoint before any call reaches it."""
        await self.check_session(session_id, owner)
        path = checkpoints.training_path(body.path)
        name = checkpoints.checkpoint_name(path.name)
        model_id = f"{session_id}:train:{model_seq_id}"

        async def create() -> Payload:
            source = await self.training_run(path.model_id, owner)
            base = body.base_model or source.base_model
            loom_base = self.served.loom_name(base)
            if loom_base != self.served.loom_name(source.base_model):
                raise InvalidInput(
                    f"{body.path} was trained on {source.base_model!r}, not on base_model {base!r}."
                )
            job = JobCreate(
                name=checkpoints.job_name(model_id),
                base_model=loom_base,
                mode=TrainingMode.lora,
                lora=source.lora,
                config={
                    "tinker_model_id": model_id,
                    "tinker_base_model": base,
                    "tinker_loaded_from": body.path,
                },
            )
            created = await jobs.create_job(self.db, self.trainer, job, owner)
            try:
                await self.calls.run(
                    created.id,
                    "load_state",
                    LoadStateRequest(name=name, job_id=source.job_id, optimizer=body.optimizer),
                )
            except LoomError:
                await in_transaction(
                    self.db, lambda s: jobs.set_status(s, created.id, JobStatus.failed, owner)
                )
                raise
            self.models[model_id] = TrainingModel(
                owner.id,
                created.id,
                base,
                source.lora.rank,
                await self.tokenizer_id(job.base_model),
                CallOrder(model_id),
            )
            return {"path": body.path, "model_id": model_id, "type": "load_weights"}

        return schemas.Future(request_id=await self.futures.submit(create()), model_id=model_id)

    async def training_run(self, model_id: str, owner: KeyIdentity) -> checkpoints.TrainingRun:
        """The run a Tinker model id names: a model of this gateway's lifetime, else the job
        made for it (its checkpoints outlive the gateway)."""
        if model_id in self.models:
            model = await self.model(model_id, owner)
            return checkpoints.TrainingRun(
                model_id, model.job_id, model.base_model, checkpoints.lora_for_rank(model.lora_rank)
            )

        def lookup() -> checkpoints.TrainingRun | None:
            with self.db() as session:
                return checkpoints.run_of_job(session, model_id, owner)

        run = await run_in_threadpool(lookup)
        if run is None:
            raise NotFound(f"No training run {model_id!r} (or it belongs to another API key).")
        return run

    # --- sampling ---------------------------------------------------------------------

    async def create_sampling_session(
        self, body: schemas.CreateSamplingSession, owner: KeyIdentity
    ) -> schemas.SamplingSessionCreated:
        await self.check_session(body.session_id, owner)
        if body.model_path is not None:
            ref = await self.state.weights(body.model_path)
            if ref is None:
                raise NotFound(
                    f"No sampler weights at {body.model_path!r}: save them with "
                    "save_weights_for_sampler(name) first."
                )
        elif body.base_model is not None:
            await self.served.check(body.base_model, "A sampling client")
            ref = SamplerRef(owner.id, body.base_model, None, 0)
        else:
            raise InvalidInput("create_sampling_session needs a base_model or a model_path.")
        sampler_id = f"{body.session_id}:sample:{body.sampling_session_seq_id}"
        await self.state.add_sampler(
            sampler_id,
            SamplerRef(owner.id, ref.base_model, ref.job_id, ref.version, body.model_path),
        )
        return schemas.SamplingSessionCreated(sampling_session_id=sampler_id)

    async def sampler(self, sampler_id: str, owner: KeyIdentity) -> SamplerRef:
        return owned(await self.state.sampler(sampler_id), sampler_id, owner, "Sampler")

    async def sample(self, body: schemas.Sample, owner: KeyIdentity) -> schemas.SampleFuture:
        ref = await self.sampler(body.sampling_session_id, owner)
        check_top_k(
            topk_prompt_logprobs=body.topk_prompt_logprobs,
            topk_sample_logprobs=body.topk_sample_logprobs,
        )
        if body.prompt_logprobs_last_n is not None and not (
            body.prompt_logprobs or body.topk_prompt_logprobs
        ):
            raise InvalidInput(
                "prompt_logprobs_last_n needs prompt_logprobs or topk_prompt_logprobs."
            )
        if any(chunk.type != "encoded_text" for chunk in body.prompt.chunks):
            raise InvalidInput("Only text prompts (encoded_text chunks) are supported.")
        if not any(chunk.tokens for chunk in body.prompt.chunks):
            raise InvalidInput("The prompt has no tokens.")
        with user_input("asample", "sampling_params"):
            params = sampling_params(body.sampling_params)
        tokens = [t for chunk in body.prompt.chunks for t in chunk.tokens]
        scoring = Scoring(
            prompt_logprobs=bool(body.prompt_logprobs),
            top_logprobs=body.topk_sample_logprobs,
            prompt_top_logprobs=body.topk_prompt_logprobs,
        )

        async def run() -> Payload:
            sampled = await sample(
                self.rollout, ref.job_id, ref.version, tokens, body.num_samples, params, scoring
            )
            scored = sampled.prompt_logprobs if body.prompt_logprobs else None
            top = sampled.prompt_top_logprobs
            if body.prompt_logprobs_last_n is not None:
                scored, top = (
                    last_n(scored, body.prompt_logprobs_last_n),
                    last_n(top, body.prompt_logprobs_last_n),
                )
            return wire.sample_response(
                sampled.samples, scored, top, body.topk_sample_logprobs, body.topk_prompt_logprobs
            )

        ids = [f"{body.sampling_session_id}:{body.seq_id}:{i}" for i in range(body.num_samples)]
        return schemas.SampleFuture(
            request_id=await self.futures.submit(run()), sample_sequence_ids=ids
        )

    # --- plumbing ---------------------------------------------------------------------

    async def skip_call(self, body: bytes) -> None:
        """A call Loom does not serve: if its JSON body numbers a call of a model of ours,
        that number is used up."""
        try:
            fields = json.loads(body) if body else None
        except ValueError:
            return
        if not isinstance(fields, dict):
            return
        model = self.models.get(str(fields.get("model_id")))
        seq_id = fields.get("seq_id")
        if model is not None and isinstance(seq_id, int):
            await model.calls.skip(self.futures, seq_id)

    async def _in_order(
        self, model: TrainingModel, seq_id: int, submit: Any, result: Any
    ) -> schemas.Future:
        return schemas.Future(
            request_id=await model.calls.place(self.futures, seq_id, submit, result)
        )


def last_n(per_position: list[T] | None, n: int) -> list[T | None] | None:
    """Only the last `n` prompt positions scored (prompt_logprobs_last_n): None before them."""
    if per_position is None:
        return None
    unscored = max(len(per_position) - n, 0)
    return [None] * unscored + per_position[unscored:]
