"""A stand-in for the trainer's `POST /v1/models`, for gateway tests that create jobs."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

from services.common.app_factory import create_service_app
from services.common.errors import InvalidInput
from services.trainer.schemas import CreateModelRequest, ModelInfo, TrainingMode


def trainer_stand_in() -> FastAPI:
    """Stands in for the trainer's `POST /v1/models` only (the job logic needs nothing else):
    it accepts the real request schema and refuses a base model that does not exist."""
    router = APIRouter(prefix="/v1")
    created: list[CreateModelRequest] = []

    @router.post("/models", status_code=201, response_model=ModelInfo)
    async def create_model(body: CreateModelRequest) -> ModelInfo:
        if body.base_model.startswith("/missing"):
            raise InvalidInput(f"Base model directory {body.base_model!r} does not exist")
        created.append(body)
        lora = body.lora if body.mode == TrainingMode.lora else None
        return ModelInfo(model_id=body.job_id, job_id=body.job_id, base_model=body.base_model,
                         mode=body.mode, lora=lora, num_params=0, trainable_params=0, step=0,
                         last_version=0)

    app = create_service_app("trainer", routers=[router])
    app.state.created = created
    return app
