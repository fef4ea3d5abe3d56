"""The trainer's typed client: one method per route, and operations polled until done.

Each submission carries an idempotency key (a fresh one unless the caller passes its own), so
the client may send it again after a lost answer: the trainer answers a repeat with the first
submission's operation instead of running it twice.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from services.common.errors import error_from_envelope
from services.common.http import IDEMPOTENCY_KEY_HEADER, Route, ServiceClient
from services.common.schemas import Operation
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

OPERATION_WAIT_S = 30.0  # the server's long-poll per request (its limit is 60 s)

CREATE_MODEL = Route("POST", "/v1/models", ModelInfo, CreateModelRequest)
GET_MODEL = Route("GET", "/v1/models/{model_id}", ModelInfo)
FORWARD_BACKWARD = Route(
    "POST", "/v1/models/{model_id}/forward_backward", Operation, ForwardBackwardRequest
)
FORWARD = Route("POST", "/v1/models/{model_id}/forward", Operation, ForwardRequest)
OPTIM_STEP = Route("POST", "/v1/models/{model_id}/optim_step", Operation, OptimStepRequest)
RESET_OPTIMIZER = Route("POST", "/v1/models/{model_id}/reset_optimizer", Operation)
SAVE_WEIGHTS = Route("POST", "/v1/models/{model_id}/save_weights", Operation, SaveWeightsRequest)
SAVE_STATE = Route("POST", "/v1/models/{model_id}/save_state", Operation, SaveStateRequest)
LOAD_STATE = Route("POST", "/v1/models/{model_id}/load_state", Operation, LoadStateRequest)
LIST_CHECKPOINTS = Route("GET", "/v1/models/{model_id}/checkpoints", CheckpointList)
DELETE_CHECKPOINT = Route("DELETE", "/v1/models/{model_id}/checkpoints/{name}", StateCheckpoint)
SET_CHECKPOINT_EXPIRY = Route(
    "PUT", "/v1/models/{model_id}/checkpoints/{name}/expiry", StateCheckpoint, CheckpointExpiry
)
GET_OPERATION = Route("GET", "/v1/operations/{op_id}", Operation)

# The submissions, by the action name the SDK protocols use (`submit`).
SUBMISSIONS: dict[str, Route[Operation]] = {
    "forward_backward": FORWARD_BACKWARD,
    "forward": FORWARD,
    "optim_step": OPTIM_STEP,
    "reset_optimizer": RESET_OPTIMIZER,
    "save_weights": SAVE_WEIGHTS,
    "save_state": SAVE_STATE,
    "load_state": LOAD_STATE,
}


class TrainerClient(ServiceClient):
    SERVICE = "trainer"

    async def create_model(self, request: CreateModelRequest) -> ModelInfo:
        """The model, created or (same configuration) already there: the call is idempotent."""
        return await self.call(CREATE_MODEL, request)

    async def get_model(self, model_id: str) -> ModelInfo:
        return await self.call(GET_MODEL, model_id=model_id)

    async def submit(
        self, action: str, model_id: str, request: Any = None, *, idempotency_key: str | None = None
    ) -> Operation:
        """Queue `action` (a key of `SUBMISSIONS`) on the model; retried safely under one
        idempotency key."""
        key = idempotency_key or uuid.uuid4().hex
        return await self.call(
            SUBMISSIONS[action], request, model_id=model_id, headers={IDEMPOTENCY_KEY_HEADER: key}
        )

    async def forward_backward(
        self, model_id: str, request: ForwardBackwardRequest, *, idempotency_key: str | None = None
    ) -> Operation:
        return await self.submit(
            "forward_backward", model_id, request, idempotency_key=idempotency_key
        )

    async def forward(
        self, model_id: str, request: ForwardRequest, *, idempotency_key: str | None = None
    ) -> Operation:
        return await self.submit("forward", model_id, request, idempotency_key=idempotency_key)

    async def optim_step(
        self, model_id: str, request: OptimStepRequest, *, idempotency_key: str | None = None
    ) -> Operation:
        return await self.submit("optim_step", model_id, request, idempotency_key=idempotency_key)

    async def reset_optimizer(
        self, model_id: str, *, idempotency_key: str | None = None
    ) -> Operation:
        return await self.submit("reset_optimizer", model_id, idempotency_key=idempotency_key)

    async def save_weights(
        self, model_id: str, request: SaveWeightsRequest, *, idempotency_key: str | None = None
    ) -> Operation:
        return await self.submit("save_weights", model_id, request, idempotency_key=idempotency_key)

    async def save_state(
        self, model_id: str, request: SaveStateRequest, *, idempotency_key: str | None = None
    ) -> Operation:
        return await self.submit("save_state", model_id, request, idempotency_key=idempotency_key)

    async def load_state(
        self, model_id: str, request: LoadStateRequest, *, idempotency_key: str | None = None
    ) -> Operation:
        return await self.submit("load_state", model_id, request, idempotency_key=idempotency_key)

    async def list_checkpoints(self, model_id: str) -> CheckpointList:
        return await self.call(LIST_CHECKPOINTS, model_id=model_id)

    async def delete_checkpoint(self, model_id: str, name: str) -> StateCheckpoint:
        return await self.call(DELETE_CHECKPOINT, model_id=model_id, name=name)

    async def set_checkpoint_expiry(
        self, model_id: str, name: str, request: CheckpointExpiry
    ) -> StateCheckpoint:
        return await self.call(SET_CHECKPOINT_EXPIRY, request, model_id=model_id, name=name)

    async def get_operation(self, op_id: str, wait: float = 0.0) -> Operation:
        """The operation as it stands, or once done within `wait` seconds (long-poll)."""
        return await self.call(GET_OPERATION, params={"wait": wait}, op_id=op_id)

    async def wait(self, operation: Operation | str, timeout: float | None = None) -> Operation:
        """`operation` (or the one of that id) once done, polled with long waits;
        TimeoutError after `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        op_id = operation if isinstance(operation, str) else operation.id
        current = None if isinstance(operation, str) else operation
        while current is None or not current.done:
            wait = OPERATION_WAIT_S
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
                if wait == 0.0:
                    raise TimeoutError(f"operation {op_id} not done after {timeout} s")
            current = await self.get_operation(op_id, wait)
        return current

    async def result(self, operation: Operation | str, timeout: float | None = None) -> Any:
        """The finished operation's result (JSON), or its error raised as a typed error."""
        return operation_result(await self.wait(operation, timeout))

    async def run(self, action: str, model_id: str, request: Any = None) -> Any:
        """Submit and wait: the result of `action` on the model."""
        return await self.result(await self.submit(action, model_id, request))


def operation_result(operation: Operation) -> Any:
    """A finished operation's result, or its error as the typed error it names."""
    if operation.error is not None:
        raise error_from_envelope(400, {"error": operation.error.model_dump()})
    return operation.result
