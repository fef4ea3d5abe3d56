"""Weaver's calls mapped onto Loom. A Weaver training model is a Loom job (its id is the job
id, so a model outlives the gateway's memory); forward, forward_backward, optimizer steps and
sampler exports reach the trainer in the order the SDK numbered them (`seq_id`); a sampler
export publishes a modelstate version and a sampling session is bound to one version;
checkpoints are the job's trainer checkpoints."""

from __future__ import annotations

import uuid
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

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
from gateway.compat.common.state import SamplerRef, SdkSession, SdkState
from gateway.compat.weaver import convert, paths, schemas
from gateway.jobs import jobs
from gateway.jobs import logs as job_logs
from gateway.schemas import Job, JobCreate, JobStatus, MetricPoint
from services.common.base_models import resolve_base_model
from services.common.db import in_transaction
from services.common.errors import Conflict, InvalidInput, NotFound
from services.rollout.client import RolloutClient
from services.rollout.schemas import SamplingParams
from services.trainer.client import TrainerClient
from services.trainer.schemas import (
    LoadStateRequest,
    LoraConfig,
    SaveStateRequest,
    SaveWeightsRequest,
    SaveWeightsResult,
    StateCheckpoint,
    TrainingMode,
)

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
MODES = {"lora": TrainingMode.lora, "full_ft": TrainingMode.full}


def public_session(session_id: str, session: SdkSession) -> schemas.SessionInfo:
    return schemas.SessionInfo(
        id=session_id, name=session.name, created_at=session.created_at.isoformat()
    )


@dataclass
class TrainingModel:
    job: Job
    owner: str | None  # the key that made it
    base_model: str  # the name the SDK gave
    tokenizer_path: str
    calls: CallOrder
    terminated: bool = False

    @property
    def id(self) -> str:
        return self.job.id

    def public(self) -> schemas.TrainingModel:
        lora = self.job.lora
        return schemas.TrainingModel(
            id=self.id,
            base_model=self.base_model,
            training_mode="lora" if self.job.mode == TrainingMode.lora else "full_ft",
            lora_config=None if lora is None else schemas.LoraSummary(rank=lora.rank),
            tokenizer_path=self.tokenizer_path,
            status="terminated" if self.terminated else "active",
            created_at=self.job.created_at.isoformat(),
        )


def public_sampling(sampling_id: str, bound: SamplerRef) -> schemas.SamplingSession:
    assert bound.tokenizer_path is not None  # Weaver's sampling sessions name theirs
    return schemas.SamplingSession(
        id=sampling_id,
        base_model=bound.base_model,
        model_path=bound.model_path,
        model_id=bound.job_id,
        weight_version=bound.version,
        tokenizer_path=bound.tokenizer_path,
    )


class WeaverService:
    def __init__(
        self,
        db: sessionmaker[Session],
        trainer: TrainerClient,
        rollout: RolloutClient,
        base_models: dict[str, str],
        data_dir: Path,
    ) -> None:
        self.db = db
        self.trainer = trainer
        self.rollout = rollout
        self.served = ServedModels(rollout, base_models)
        self.data_dir = data_dir
        self.futures = Futures(db, "op")
        self.calls = TrainerCalls(trainer)
        # sessions, sampling sessions and named sampler weights
        self.state = SdkState(db, "weaver")
        self.models: dict[str, TrainingModel] = {}  # those this replica has served

    # --- sessions and base models -----------------------------------------------------

    async def create_session(
        self, body: schemas.CreateSession, owner: KeyIdentity
    ) -> schemas.SessionInfo:
        session_id = f"ws-{uuid.uuid4().hex[:16]}"
        return public_session(
            session_id, await self.state.add_session(session_id, owner, body.name)
        )

    async def session(self, session_id: str, owner: KeyIdentity) -> SdkSession:
        return owned(await self.state.session(session_id), session_id, owner, "Session")

    def tokenizer_path(self, loom_base_model: str) -> str:
        """Where the SDK loads the tokenizer from: the model's directory on this host."""
        return resolve_base_model(loom_base_model, self.data_dir)

    async def log_metrics(
        self, session_id: str, body: schemas.LogMetrics, owner: KeyIdentity
    ) -> schemas.MetricsAccepted:
        """The script's own metrics (rewards, evals) as its job's metrics: charted by the web
        admin like any job's."""
        await self.session(session_id, owner)
        by_model: dict[str, list[MetricPoint]] = {}
        with user_input("log_metrics", "metrics"):
            for spec in body.metrics:
                point = MetricPoint(step=spec.step, name=spec.name, value=spec.value)
                by_model.setdefault(spec.model_id, []).append(point)
        models = [await self.model(model_id, owner) for model_id in by_model]

        def record(session: Session) -> int:
            return sum(
                job_logs.log_metrics(session, model.id, by_model[model.id]) for model in models
            )

        return schemas.MetricsAccepted(accepted=await in_transaction(self.db, record))

    # --- training models --------------------------------------------------------------

    async def create_model(
        self, session_id: str, body: schemas.CreateModel, owner: KeyIdentity
    ) -> schemas.TrainingModel:
        session = await self.session(session_id, owner)
        if body.model_seq_id in session.models:  # the SDK resent it: one model
            return (await self.model(session.models[body.model_seq_id], owner)).public()
        what = "A LoRA training model" if body.training_mode == "lora" else "A full model"
        base = await self.served.check(body.base_model, what)
        spec = body.lora_config
        targets = (ATTENTION if spec.train_attn else []) + (MLP if spec.train_mlp else [])
        if body.training_mode == "lora" and not targets:
            raise InvalidInput(
                "lora_config trains nothing: train_attn or train_mlp must be "
                "true (train_unembed alone is not served)."
            )
        with user_input("create_model", "lora_config"):
            job = JobCreate(
                name=f"weaver {session.name or session_id} #{body.model_seq_id}",
                base_model=base,
                mode=MODES[body.training_mode],
                lora=LoraConfig(
                    rank=spec.rank, alpha=float(spec.rank), target_modules=targets or ATTENTION
                ),
                config={
                    "weaver_base_model": body.base_model,
                    "weaver_session": session_id,
                    "weaver_model_seq_id": body.model_seq_id,
                    "weaver_user_metadata": body.user_metadata or {},
                },
            )
        tokenizer = await run_in_threadpool(self.tokenizer_path, base)
        created = await jobs.create_job(self.db, self.trainer, job, owner)
        model = TrainingModel(created, owner.id, body.base_model, tokenizer, CallOrder(created.id))
        self.models[model.id] = model
        await self.state.add_session_model(session_id, body.model_seq_id, model.id)
        return model.public()

    async def model(self, model_id: str, owner: KeyIdentity) -> TrainingModel:
        """A model this replica has served, else found by its job (made through another
        replica, or before a restart)."""
        model = self.models.get(model_id)
        if model is not None:
            if not owner.sees_job(model.id, model.owner):
                raise NotFound(f"No model {model_id!r} (or it belongs to another API key).")
            return model

        def lookup() -> tuple[Job, str]:
            with self.db() as session:
                row = jobs.get_job_row(session, model_id, owner)
                return jobs.to_public(row), row.owner_key_id

        job, job_owner = await run_in_threadpool(lookup)
        name = job.config.get("weaver_base_model")
        if not isinstance(name, str):
            raise NotFound(f"Job {model_id!r} was not made by the Weaver SDK.")
        tokenizer = await run_in_threadpool(self.tokenizer_path, job.base_model)
        # The SDK goes on numbering where it was: the first call seen sets the order.
        model = TrainingModel(
            job,
            job_owner,
            name,
            tokenizer,
            CallOrder(model_id, next_seq=0),
            terminated=ended(job.status),
        )
        return self.models.setdefault(model_id, model)

    async def live_model(self, model_id: str, owner: KeyIdentity) -> TrainingModel:
        model = await self.model(model_id, owner)
        if not model.terminated:  # through another replica, since this one last looked
            model.terminated = ended(
                await in_transaction(
                    self.db, lambda s: JobStatus(jobs.get_job_row(s, model.id, owner).status)
                )
            )
        if model.terminated:
            raise Conflict(
                f"Model {model_id!r} was terminated; create a new one (its "
                "checkpoints load into it)."
            )
        return model

    async def terminate(self, model_id: str, owner: KeyIdentity) -> schemas.Terminated:
        model = await self.model(model_id, owner)
        if not model.terminated:
            model.terminated = True
            with suppress(Conflict):  # already finished through Loom's own API
                await in_transaction(
                    self.db, lambda s: jobs.set_status(s, model.id, JobStatus.completed, owner)
                )
        return schemas.Terminated(model_id=model_id)

    @numbered(lambda model_id, body, *_, **__: (model_id, body.payload.seq_id))
    async def forward(
        self, model_id: str, body: schemas.PassBody, owner: KeyIdentity, backward: bool
    ) -> str:
        payload = body.payload
        model = await self.ordered_model(model_id, payload.model_id, owner)
        request = payload.forward_backward_input if backward else payload.forward_input
        if request is None:
            field_name = "forward_backward_input" if backward else "forward_input"
            raise InvalidInput(f"payload.{field_name} is missing.")
        if payload.tensor_transport != "default":
            raise InvalidInput(
                f"tensor_transport {payload.tensor_transport!r} is not served; "
                "use the default JSON transport."
            )
        call = "forward_backward" if backward else "forward"
        with user_input(call, "data"):
            batch = convert.training_batch(request)
        if backward and batch.loss is None:
            raise InvalidInput(
                "forward_logprob computes no loss: call forward, not forward_backward, with it."
            )
        training = TrainingPass.of(call, batch.data, batch.loss, backward=backward)

        async def submit() -> str:
            return await training.submit(self.calls, model.id)

        async def result(op: str) -> Payload:
            done = await training.result(self.calls, op)
            return convert.outputs(batch, done.logprobs, done.loss)

        return await model.calls.place(self.futures, payload.seq_id, submit, result)

    @numbered(lambda model_id, body, _owner: (model_id, body.payload.seq_id))
    async def optim_step(self, model_id: str, body: schemas.OptimBody, owner: KeyIdentity) -> str:
        payload = body.payload
        model = await self.ordered_model(model_id, payload.model_id, owner)
        step = optim_step_request(payload.adam_params)

        async def submit() -> str:
            return await self.calls.submit(model.id, "optim_step", step)

        async def result(op: str) -> Payload:
            done = await self.calls.result(op)
            return {
                "metrics": {"grad_norm:mean": float(done["grad_norm"])},
                "step": done.get("step"),
            }

        return await model.calls.place(self.futures, payload.seq_id, submit, result)

    @numbered(lambda model_id, body, _owner: (model_id, body.seq_id))
    async def export_sampler(
        self, model_id: str, body: schemas.ExportSampler, owner: KeyIdentity
    ) -> str:
        model = await self.live_model(model_id, owner)
        if body.path is not None:
            with user_input("save_weights_for_sampler", "path"):
                SaveStateRequest(name=body.path)  # the same rule as checkpoint names
            if paths.VERSION_NAME.match(body.path):
                raise InvalidInput(
                    f"Sampler weights name {body.path!r} is reserved for "
                    "unnamed exports (v<version>); pick another name."
                )

        async def submit() -> str:
            return await self.calls.submit(model.id, "save_weights", SaveWeightsRequest())

        async def result(op: str) -> Payload:
            saved = SaveWeightsResult.model_validate(await self.calls.result(op))
            path = paths.WeaverPath(
                model.id, paths.SAMPLER_WEIGHTS, body.path or f"v{saved.number}"
            )
            if body.path is not None:
                await self.state.add_weights(
                    str(path),
                    SamplerRef(
                        model.owner,
                        model.base_model,
                        model.id,
                        saved.number,
                        expires_at=expiry(body.ttl_seconds),
                    ),
                )
            return {"model_path": str(path), "path": str(path), "weight_version": saved.number}

        return await model.calls.place(self.futures, body.seq_id, submit, result)

    async def ordered_model(
        self, model_id: str, payload_model_id: str, owner: KeyIdentity
    ) -> TrainingModel:
        if payload_model_id != model_id:
            raise InvalidInput(
                f"payload.model_id {payload_model_id!r} is not the model of the URL ({model_id!r})."
            )
        return await self.live_model(model_id, owner)

    # --- checkpoints ------------------------------------------------------------------

    async def save_checkpoint(
        self, model_id: str, body: schemas.SaveCheckpoint, owner: KeyIdentity
    ) -> str:
        model = await self.live_model(model_id, owner)
        if body.type == "sampling":
            raise InvalidInput(
                "Sampling checkpoints are sampler exports: call save_weights_for_sampler."
            )
        with user_input("save_state", "name"):
            request = SaveStateRequest(
                name=body.name or f"checkpoint-{uuid.uuid4().hex[:8]}",
                expires_at=expiry(body.ttl_seconds),
            )

        async def submit() -> str:
            return await self.calls.submit(model.id, "save_state", request)

        async def result(op: str) -> Payload:
            saved = StateCheckpoint.model_validate(await self.calls.result(op))
            return paths.checkpoint(model.id, saved, body.type)

        return await model.calls.place(self.futures, None, submit, result)

    async def load_checkpoint(
        self, model_id: str, body: schemas.LoadCheckpoint, owner: KeyIdentity
    ) -> str:
        model = await self.live_model(model_id, owner)
        path = paths.parse(body.path, paths.CHECKPOINTS)
        source = await self.model(path.model_id, owner)
        request = LoadStateRequest(
            name=path.name,
            optimizer=body.include_optimizer,
            job_id=None if source.id == model.id else source.id,
        )

        async def submit() -> str:
            return await self.calls.submit(model.id, "load_state", request)

        async def result(op: str) -> Payload:
            await self.calls.result(op)
            return {
                "path": body.path,
                "model_id": model.id,
                "include_optimizer": body.include_optimizer,
            }

        return await model.calls.place(self.futures, None, submit, result)

    async def list_checkpoints(self, model_id: str, owner: KeyIdentity) -> schemas.Checkpoints:
        model = await self.model(model_id, owner)
        listed = await self.trainer.list_checkpoints(model.id)
        return schemas.Checkpoints.model_validate(
            {"items": [paths.checkpoint(model.id, c) for c in listed.checkpoints]}
        )

    # --- sampling ---------------------------------------------------------------------

    async def create_sampling_session(
        self, session_id: str, body: schemas.CreateSamplingSession, owner: KeyIdentity
    ) -> schemas.SamplingSession:
        await self.session(session_id, owner)
        if body.model_path is not None:
            path = paths.parse(body.model_path, paths.SAMPLER_WEIGHTS)
            model = await self.model(path.model_id, owner)
            version = path.version or await self.named_sampler_version(body.model_path)
            if version is None:
                raise NotFound(
                    f"No sampler weights at {body.model_path!r} (unnamed ones, "
                    "v<version>, always resolve)."
                )
            bound = SamplerRef(
                owner.id, model.base_model, model.id, version, body.model_path, model.tokenizer_path
            )
        elif body.base_model is not None:
            base = await self.served.check(body.base_model, "A sampling client")
            tokenizer = await run_in_threadpool(self.tokenizer_path, base)
            bound = SamplerRef(owner.id, body.base_model, None, 0, None, tokenizer)
        else:
            raise InvalidInput("A sampling session needs a base_model or a model_path.")
        sampling_id = f"{session_id}-sampler-{body.sampling_session_seq_id}"
        await self.state.add_sampler(sampling_id, bound)
        return public_sampling(sampling_id, bound)

    async def named_sampler_version(self, model_path: str) -> int | None:
        """The version named sampler weights hold, unless their TTL ran out (unnamed exports,
        `v<version>`, are the store's versions, kept under its retention)."""
        ref = await self.state.weights(model_path)
        return None if ref is None else ref.version

    async def sampling_session(self, sampling_id: str, owner: KeyIdentity) -> SamplerRef:
        return owned(await self.state.sampler(sampling_id), sampling_id, owner, "Sampling session")

    async def close_sampling_session(self, sampling_id: str, owner: KeyIdentity) -> None:
        await self.sampling_session(sampling_id, owner)
        await self.state.drop_sampler(sampling_id)

    async def sample(self, sampling_id: str, body: schemas.SampleBody, owner: KeyIdentity) -> str:
        bound = await self.sampling_session(sampling_id, owner)
        asked = [
            name
            for name in (
                "return_sampling_mask",
                "return_old_logprob",
                "return_moe_topk_indices",
                "score_centering",
            )
            if getattr(body, name)
        ]
        if asked:
            raise InvalidInput(f"Not served by Loom yet: {', '.join(asked)}.")
        check_top_k(topk_prompt_logprobs=body.topk_prompt_logprobs)
        tokens = prompt_tokens(body.prompt)
        with user_input("sample", "sampling_params"):
            params = convert.sampling_params(body.sampling_params)
        scoring = Scoring(
            prompt_logprobs=body.prompt_logprobs, prompt_top_logprobs=body.topk_prompt_logprobs
        )

        async def run() -> Payload:
            return convert.sequences(
                await sample(
                    self.rollout,
                    bound.job_id,
                    bound.version,
                    tokens,
                    body.num_samples,
                    params,
                    scoring,
                ),
                body.prompt_logprobs,
            )

        return await self.futures.submit(run())

    async def compute_logprobs(
        self, sampling_id: str, body: schemas.LogprobsBody, owner: KeyIdentity
    ) -> str:
        """Each prompt token's logprob under the session's weights (None for the first)."""
        bound = await self.sampling_session(sampling_id, owner)
        if body.return_rollout_token_expert:
            raise InvalidInput(
                "return_rollout_token_expert (MoE router replay) is not served by Loom."
            )
        tokens = prompt_tokens(body.prompt)

        async def run() -> Payload:
            scored = await sample(
                self.rollout,
                bound.job_id,
                bound.version,
                tokens,
                1,
                SamplingParams(max_tokens=1, temperature=0.0),
                Scoring(prompt_logprobs=True),
            )
            return {
                "result": {"prompt_logprobs": scored.prompt_logprobs},
                "weight_version": scored.version,
            }

        return await self.futures.submit(run())


def ended(status: JobStatus) -> bool:
    """A terminated model's job: completed by `terminate` (or through Loom's own API)."""
    return status not in (JobStatus.running, JobStatus.paused)


def prompt_tokens(prompt: schemas.ModelInput) -> list[int]:
    if any(chunk.type != "encoded_text" for chunk in prompt.chunks):
        raise InvalidInput("Only text prompts (encoded_text chunks) are served.")
    tokens = prompt.tokens()
    if not tokens:
        raise InvalidInput("The prompt has no tokens.")
    return tokens
