"""The Tinker SDK's endpoints (`/api/v1/...`): parse, call `TinkerService`, return."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response, status

from gateway.auth.deps import CurrentKey
from gateway.auth.dialects import ClientDialect
from gateway.compat.common.params import Limit, Offset
from gateway.compat.tinker import runs, schemas
from gateway.compat.tinker.futures import PENDING, failure, retrieve
from gateway.compat.tinker.service import TinkerService
from gateway.proxy.request_body import read_capped
from services.common.deps import app_state
from services.common.errors import InvalidInput, NotFound

# Every route is async: the service's state and futures live on the event loop.
router = APIRouter(prefix="/api/v1", tags=["tinker"])
TinkerDep = Annotated[TinkerService, Depends(app_state("tinker"))]
# Below the SDK's 45 s read timeout: it asks again at once after a try-again.
RETRIEVE_WAIT_S = 25.0
PROTOBUF = "application/x-protobuf"
# The SDK's own chunks stay under 5 MB; this leaves room without letting a body exhaust memory.
MAX_FORWARD_BACKWARD_BYTES = 64 << 20
UNSERVED_BODY_BYTES = 1 << 20  # read only for its model_id and seq_id
# Loom has no shared runs: what a key may access is what it owns (an admin key sees all).
AccessScope = Annotated[Literal["owned", "accessible"], Query()]
# The SDK refuses keys without this prefix, so Tinker scripts send `tml-<loom key>`.
DIALECT = ClientDialect(key_prefix="tml-")


@router.post("/client/config")
async def client_config() -> schemas.ClientConfig:
    return schemas.ClientConfig()


@router.post("/client/dynamic_config")
async def dynamic_config() -> schemas.DynamicConfig:
    return schemas.DynamicConfig(refresh_interval_sec=300)


@router.get("/healthz")
async def healthz() -> schemas.Status:
    return schemas.Status(status="ok")


@router.post("/telemetry")
async def telemetry() -> schemas.Status:
    return schemas.Status(status="accepted")  # the SDK's events are not kept


@router.post("/create_session")
async def create_session(tinker: TinkerDep, key: CurrentKey) -> schemas.SessionCreated:
    return schemas.SessionCreated(session_id=await tinker.create_session(key))


@router.post("/session_heartbeat")
async def heartbeat(
    body: schemas.Heartbeat, tinker: TinkerDep, key: CurrentKey
) -> schemas.HeartbeatDone:
    await tinker.check_session(body.session_id, key)
    return schemas.HeartbeatDone()


@router.post("/sessions/{session_id}/finish", status_code=status.HTTP_204_NO_CONTENT)
async def finish_session(session_id: str, tinker: TinkerDep, key: CurrentKey) -> None:
    await tinker.check_session(session_id, key)


@router.post("/create_model", response_model_exclude_none=True)
async def create_model(
    body: schemas.CreateModel, tinker: TinkerDep, key: CurrentKey
) -> schemas.Future:
    return await tinker.create_model(body, key)


@router.post("/get_info")
async def get_info(body: schemas.ModelRef, tinker: TinkerDep, key: CurrentKey) -> schemas.ModelInfo:
    return await tinker.get_info(body.model_id, key)


@router.post("/forward_backward", response_model_exclude_none=True)
async def forward_backward(request: Request, tinker: TinkerDep, key: CurrentKey) -> schemas.Future:
    if request.headers.get("content-encoding"):
        raise InvalidInput("Compressed forward_backward bodies are not supported.")
    body = await read_capped(
        request,
        MAX_FORWARD_BACKWARD_BYTES,
        ": send fewer data per call (the SDK splits calls by fwdbwd_max_chunk_bytes_count)",
    )
    return await tinker.forward_backward(body, key)


@router.post("/optim_step", response_model_exclude_none=True)
async def optim_step(body: schemas.OptimStep, tinker: TinkerDep, key: CurrentKey) -> schemas.Future:
    return await tinker.optim_step(body, key)


@router.post("/save_weights_for_sampler", response_model_exclude_none=True)
async def save_weights_for_sampler(
    body: schemas.SaveForSampler, tinker: TinkerDep, key: CurrentKey
) -> schemas.Future:
    return await tinker.save_for_sampler(body, key)


@router.post("/save_weights", response_model_exclude_none=True)
async def save_weights(
    body: schemas.SaveState, tinker: TinkerDep, key: CurrentKey
) -> schemas.Future:
    """The SDK's save_state: a trainer checkpoint of the model's job."""
    return await tinker.save_state(body, key)


@router.post("/load_weights", response_model_exclude_none=True)
async def load_weights(
    body: schemas.LoadState, tinker: TinkerDep, key: CurrentKey
) -> schemas.Future:
    """load_state(_with_optimizer), and create_training_client_from_state(_with_optimizer)."""
    return await tinker.load_state(body, key)


@router.post("/weights_info")
async def weights_info(
    body: schemas.WeightsInfo, tinker: TinkerDep, key: CurrentKey
) -> schemas.WeightsInfoResponse:
    return await runs.weights_info(tinker, body.tinker_path, key)


@router.get("/get_server_capabilities")
async def server_capabilities(tinker: TinkerDep, _key: CurrentKey) -> schemas.ServerCapabilities:
    """The base models Loom serves (trainable and sampleable) and those only named in
    LOOM_GATEWAY_SDK_BASE_MODELS for another base."""
    return await runs.capabilities(tinker)


@router.get("/training_runs")
async def list_training_runs(
    tinker: TinkerDep,
    key: CurrentKey,
    limit: Limit = 20,
    offset: Offset = 0,
    access_scope: AccessScope = "owned",
    project_id: str | None = None,
) -> schemas.TrainingRuns:
    runs.check_scope(project_id)
    return await runs.training_runs(tinker, key, limit, offset)


@router.get("/training_runs/{model_id}")
async def get_training_run(
    model_id: str, tinker: TinkerDep, key: CurrentKey, access_scope: AccessScope = "owned"
) -> schemas.TrainingRun:
    return await runs.training_run(tinker, model_id, key)


@router.get("/training_runs/{model_id}/checkpoints")
async def list_checkpoints(
    model_id: str, tinker: TinkerDep, key: CurrentKey
) -> schemas.CheckpointsList:
    return await runs.list_checkpoints(tinker, model_id, key)


@router.get("/checkpoints")
async def list_user_checkpoints(
    tinker: TinkerDep, key: CurrentKey, limit: Limit = 100, offset: Offset = 0
) -> schemas.CheckpointsList:
    return await runs.user_checkpoints(tinker, key, limit, offset)


@router.put(
    "/training_runs/{model_id}/checkpoints/{checkpoint_id:path}/ttl",
    status_code=status.HTTP_204_NO_CONTENT,
)
async def set_checkpoint_ttl(
    model_id: str,
    checkpoint_id: str,
    body: schemas.CheckpointTtl,
    tinker: TinkerDep,
    key: CurrentKey,
) -> None:
    await runs.set_ttl(tinker, model_id, checkpoint_id, body, key)


@router.delete("/training_runs/{model_id}/checkpoints/{checkpoint_id:path}")
async def delete_checkpoint(
    model_id: str, checkpoint_id: str, tinker: TinkerDep, key: CurrentKey
) -> None:
    await runs.delete_checkpoint(tinker, model_id, checkpoint_id, key)


@router.get("/sessions")
async def list_sessions(
    tinker: TinkerDep,
    key: CurrentKey,
    limit: Limit = 20,
    offset: Offset = 0,
    access_scope: AccessScope = "owned",
) -> schemas.Sessions:
    """The key's sessions (an admin key: every session), newest first."""
    return await runs.sessions(tinker, key, limit, offset)


@router.get("/sessions/{session_id}")
async def get_session(
    session_id: str, tinker: TinkerDep, key: CurrentKey, access_scope: AccessScope = "owned"
) -> schemas.SessionInfo:
    return await runs.session_info(tinker, session_id, key)


@router.post("/create_sampling_session")
async def create_sampling_session(
    body: schemas.CreateSamplingSession, tinker: TinkerDep, key: CurrentKey
) -> schemas.SamplingSessionCreated:
    return await tinker.create_sampling_session(body, key)


@router.get("/samplers/{sampler_id:path}")
async def get_sampler(sampler_id: str, tinker: TinkerDep, key: CurrentKey) -> schemas.SamplerInfo:
    ref = await tinker.sampler(sampler_id, key)
    return schemas.SamplerInfo(
        sampler_id=sampler_id, base_model=ref.base_model, model_path=ref.model_path
    )


@router.post("/asample")
async def asample(body: schemas.Sample, tinker: TinkerDep, key: CurrentKey) -> schemas.SampleFuture:
    return await tinker.sample(body, key)


@router.post("/retrieve_future", response_model=None)
async def retrieve_future(
    body: schemas.RetrieveFuture, tinker: TinkerDep, _key: CurrentKey
) -> Response | dict[str, Any]:
    result = await retrieve(tinker.futures, body.request_id, RETRIEVE_WAIT_S)
    if result is PENDING:
        return {"type": "try_again", "request_id": body.request_id, "queue_state": "active"}
    if isinstance(result, bytes):
        return Response(content=result, media_type=PROTOBUF)
    return result  # type: ignore[return-value]


@router.post("/{call}", response_model_exclude_none=True)
async def unsupported(
    call: str, request: Request, tinker: TinkerDep, _key: CurrentKey
) -> schemas.Future:
    """Calls Loom does not serve yet fail as the SDK expects a failed call to (its own
    error shape, category `user`), never hang; a numbered one uses its number up, so the
    model's next call proceeds."""
    await tinker.skip_call(await read_capped(request, UNSERVED_BODY_BYTES))

    async def refuse() -> Any:
        return failure(InvalidInput(f"Loom does not serve the Tinker call {call!r} yet."))

    return schemas.Future(request_id=await tinker.futures.submit(refuse()))


# Not an operation of the API, so not in its OpenAPI description.
@router.api_route(
    "/{call:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False
)
async def unsupported_rest(call: str, request: Request, _key: CurrentKey) -> None:
    """REST calls Loom does not serve (publishing checkpoints, exports, billing, ...)."""
    raise NotFound(
        f"Loom does not serve the Tinker call {request.method} /api/v1/{call} yet.", {"call": call}
    )
