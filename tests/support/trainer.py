"""Stand-ins for the trainer, for gateway tests: `trainer_stand_in` answers `POST /v1/models`
(tests that create jobs); `FakeTrainer` also records model actions and answers them with
finished operations (tests of the SDK protocol adapters)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
from fastapi import APIRouter, FastAPI
from sqlalchemy.orm import Session, sessionmaker

from gateway.auth.keys import KeyIdentity, create_key
from gateway.models import ALEMBIC_DIR, VERSION_TABLE
from services.common.app_factory import create_service_app
from services.common.db import make_engine, make_sessionmaker, migrate, transaction
from services.common.errors import InvalidInput
from services.rollout.client import RolloutClient
from services.trainer.client import TrainerClient
from services.trainer.schemas import CreateModelRequest, ModelInfo, TrainingMode


def trainer_stand_in(service_token: str | None = None) -> FastAPI:
    """Stands in for the trainer's `POST /v1/models` only (the job logic needs nothing else):
    it accepts the real request schema and refuses a base model that does not exist.
    `service_token`: what it asks of callers, as the real trainer does (None: nothing)."""
    router = APIRouter(prefix="/v1")
    created: list[CreateModelRequest] = []

    @router.post("/models", status_code=201, response_model=ModelInfo)
    async def create_model(body: CreateModelRequest) -> ModelInfo:
        if body.base_model.startswith("/missing"):
            raise InvalidInput(f"Base model directory {body.base_model!r} does not exist")
        created.append(body)
        return model_info(body)

    app = create_service_app("trainer", routers=[router], service_token=service_token)
    app.state.created = created
    return app


def model_info(body: CreateModelRequest) -> ModelInfo:
    """The trainer's answer to creating `body`'s model (an empty one)."""
    lora = body.lora if body.mode == TrainingMode.lora else None
    return ModelInfo(
        model_id=body.job_id,
        job_id=body.job_id,
        base_model=body.base_model,
        mode=body.mode,
        lora=lora,
        num_params=0,
        trainable_params=0,
        step=0,
        last_version=0,
    )


NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


class FakeTrainer:
    """Records each call; checkpoint operations succeed at once unless a name is reused.
    It also answers rollout's `GET /v1/versions` (its base model: `rollout_base`)."""

    def __init__(self, rollout_base: str = "loom/tiny") -> None:
        self.rollout_base = rollout_base
        self.calls: list[tuple[str, str, dict[str, Any]]] = []  # (job, action, body)
        self.created: list[CreateModelRequest] = []
        self.saved: dict[str, list[str]] = {}
        self.expiry: dict[tuple[str, str], str | None] = {}  # (job, name) -> expires_at
        self.ops: dict[str, dict[str, Any]] = {}
        self.app = self._app()

    def _op(
        self, kind: str, result: Any = None, error: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        op = {
            "id": f"op_{uuid.uuid4().hex[:8]}",
            "kind": kind,
            "status": "failed" if error else "succeeded",
            "created_at": NOW.isoformat(),
            "result": result,
            "error": error,
        }
        self.ops[op["id"]] = op
        return op

    def _app(self) -> FastAPI:
        router = APIRouter(prefix="/v1")

        @router.post("/models", status_code=201, response_model=ModelInfo)
        async def create(body: CreateModelRequest) -> ModelInfo:
            self.created.append(body)
            return model_info(body)

        @router.post("/models/{job}/{action}", status_code=202)
        async def act(job: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
            self.calls.append((job, action, body))
            if action == "save_state":
                if body["name"] in self.saved.setdefault(job, []):
                    return self._op(
                        action,
                        error={
                            "code": "conflict",
                            "message": f"{body['name']!r} is taken",
                            "detail": {},
                        },
                    )
                self.saved[job].append(body["name"])
                self.expiry[job, body["name"]] = body.get("expires_at")
            if action == "save_weights":
                return self._op(
                    action, result={"job_id": job, "number": 1, "kind": "lora", "step": 3}
                )
            state = {
                "job_id": body.get("job_id") or job,
                "name": body.get("name", ""),
                "step": 3,
                "last_version": 0,
                "has_optimizer": True,
                "bytes": 10,
                "created_at": NOW.isoformat(),
            }
            return self._op(action, result=state)

        def checkpoint(job: str, name: str) -> dict[str, Any]:
            return {
                "job_id": job,
                "name": name,
                "step": 3,
                "last_version": 0,
                "has_optimizer": True,
                "bytes": 10,
                "created_at": NOW.isoformat(),
                "expires_at": self.expiry.get((job, name)),
            }

        @router.get("/models/{job}/checkpoints")
        async def listed(job: str) -> dict[str, Any]:
            return {"checkpoints": [checkpoint(job, name) for name in self.saved.get(job, [])]}

        @router.put("/models/{job}/checkpoints/{name}/expiry")
        async def expire(job: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
            self.calls.append((job, "expiry", body))
            self.expiry[job, name] = body["expires_at"]
            return checkpoint(job, name)

        @router.get("/versions")
        async def versions() -> dict[str, Any]:
            return {"base_model": self.rollout_base, "full": None, "loras": []}

        @router.get("/operations/{op_id}")
        async def operation(op_id: str) -> dict[str, Any]:
            return self.ops[op_id]

        return create_service_app("trainer", routers=[router], service_token=None)


@dataclass(frozen=True)
class AdapterParts:
    """What an SDK protocol adapter's service stands on in a unit test: the gateway's
    database (SQLite) with two ordinary keys, and a recording trainer reached in process
    (`client`; it answers `rollout`'s base model question too)."""

    sessions: sessionmaker[Session]
    trainer: FakeTrainer
    client: TrainerClient
    rollout: RolloutClient
    owner: KeyIdentity
    other: KeyIdentity


@asynccontextmanager
async def adapter_parts(tmp_path: Path) -> AsyncIterator[AdapterParts]:
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    migrate(url, ALEMBIC_DIR, VERSION_TABLE)
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    with transaction(sessions) as session:
        owner, other = (create_key(session, name, admin=False) for name in ("owner", "other"))
    fake = FakeTrainer()
    client = TrainerClient("http://trainer", transport=httpx2.ASGITransport(fake.app))
    rollout = RolloutClient("http://rollout", transport=httpx2.ASGITransport(fake.app))
    try:
        yield AdapterParts(
            sessions,
            fake,
            client,
            rollout,
            KeyIdentity(id=owner.id, name="owner", admin=False),
            KeyIdentity(id=other.id, name="other", admin=False),
        )
    finally:
        await client.aclose()
        await rollout.aclose()
        engine.dispose()
