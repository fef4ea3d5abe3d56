"""HTTP routes of the trainer: parse, call the service, return. Every submission of an operation
takes an `Idempotency-Key` header: the same submission sent again gets the same operation."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status

from services.common.schemas import RESOURCE_ID_PATTERN, Operation
from services.trainer.deps import IdempotencyKeyDep, ServiceDep
from services.trainer.schemas import (
    CheckpointExpiry,
    CheckpointList,
    CreateModelRequest,
    ForwardBackwardRequest,
    ForwardRequest,
    LoadStateRequest,
    ModelInfo,
    OptimStepRequest,
    SaveStateRequest,
    SaveWeightsRequest,
    StateCheckpoint,
)

router = APIRouter(prefix="/v1", tags=["trainer"])
MAX_WAIT_S = 60.0


# A plain `def`: FastAPI runs it in its thread pool, so loading a base model (seconds for a
# large one) does not stall the event loop; the response is the ready model.
@router.post("/models", status_code=status.HTTP_201_CREATED, response_model=ModelInfo)
def create_model(body: CreateModelRequest, service: ServiceDep, response: Response) -> ModelInfo:
    info, created = service.create_model(body)
    if not created:
        response.status_code = status.HTTP_200_OK
    return info


@router.get("/models/{model_id}", response_model=ModelInfo)
async def get_model(model_id: str, service: ServiceDep) -> ModelInfo:
    return service.model_info(model_id)


@router.post(
    "/models/{model_id}/forward_backward",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=Operation,
)
async def forward_backward(
    model_id: str, body: ForwardBackwardRequest, service: ServiceDep, key: IdempotencyKeyDep
) -> Operation:
    return service.forward_backward(model_id, body, key)


@router.post(
    "/models/{model_id}/forward", status_code=status.HTTP_202_ACCEPTED, response_model=Operation
)
async def forward(
    model_id: str, body: ForwardRequest, service: ServiceDep, key: IdempotencyKeyDep
) -> Operation:
    return service.forward(model_id, body, key)


@router.post(
    "/models/{model_id}/optim_step", status_code=status.HTTP_202_ACCEPTED, response_model=Operation
)
async def optim_step(
    model_id: str, body: OptimStepRequest, service: ServiceDep, key: IdempotencyKeyDep
) -> Operation:
    return service.optim_step(model_id, body, key)


@router.post(
    "/models/{model_id}/reset_optimizer",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=Operation,
)
async def reset_optimizer(model_id: str, service: ServiceDep, key: IdempotencyKeyDep) -> Operation:
    """Forget AdamW's moments and any gradients not yet applied (queued in order): a new
    phase (RL after SFT) starts without the previous phase's momentum."""
    return service.reset_optimizer(model_id, key)


@router.post(
    "/models/{model_id}/save_weights",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=Operation,
)
async def save_weights(
    model_id: str, body: SaveWeightsRequest, service: ServiceDep, key: IdempotencyKeyDep
) -> Operation:
    return service.save_weights(model_id, body, key)


@router.post(
    "/models/{model_id}/save_state", status_code=status.HTTP_202_ACCEPTED, response_model=Operation
)
async def save_state(
    model_id: str, body: SaveStateRequest, service: ServiceDep, key: IdempotencyKeyDep
) -> Operation:
    """Checkpoint weights, optimizer moments and step (queued behind earlier operations)."""
    return service.save_state(model_id, body, key)


@router.post(
    "/models/{model_id}/load_state", status_code=status.HTTP_202_ACCEPTED, response_model=Operation
)
async def load_state(
    model_id: str, body: LoadStateRequest, service: ServiceDep, key: IdempotencyKeyDep
) -> Operation:
    """Restore a checkpoint of this job (or of `job_id`, a job of the same configuration);
    `optimizer: false` loads weights and step, and resets the optimizer's moments."""
    return service.load_state(model_id, body, key)


@router.get("/models/{model_id}/checkpoints", response_model=CheckpointList)
async def list_checkpoints(model_id: str, service: ServiceDep) -> CheckpointList:
    return CheckpointList(checkpoints=service.checkpoints(model_id))


@router.delete("/models/{model_id}/checkpoints/{name}", response_model=StateCheckpoint)
async def delete_checkpoint(
    model_id: str,
    service: ServiceDep,
    name: Annotated[str, Path(pattern=RESOURCE_ID_PATTERN)],
) -> StateCheckpoint:
    """Deleted at once; a managed run's older checkpoints go by themselves."""
    return service.delete_checkpoint(model_id, name)


@router.put("/models/{model_id}/checkpoints/{name}/expiry", response_model=StateCheckpoint)
async def set_checkpoint_expiry(
    service: ServiceDep,
    body: CheckpointExpiry,
    model_id: Annotated[str, Path(pattern=RESOURCE_ID_PATTERN)],
    name: Annotated[str, Path(pattern=RESOURCE_ID_PATTERN)],
) -> StateCheckpoint:
    """When the checkpoint expires (None: never); an expired one is gone."""
    return service.set_checkpoint_expiry(model_id, name, body)


@router.get("/operations/{op_id}", response_model=Operation)
async def get_operation(
    op_id: str,
    service: ServiceDep,
    wait: float = Query(
        default=0.0,
        ge=0.0,
        le=MAX_WAIT_S,
        description="Seconds to wait for the operation to finish (long-poll).",
    ),
) -> Operation:
    return await service.operation(op_id, wait)
