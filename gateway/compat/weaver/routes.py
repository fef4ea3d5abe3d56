"""The Weaver SDK's REST paths, under `/weaver/api/v1` (`WEAVER_BASE_URL=<gateway>/weaver`).
Each route checks its body and hands it to `WeaverService`; errors take Weaver's shape."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, status

from gateway.auth.deps import CurrentKey
from gateway.compat.common.params import Limit, Offset
from gateway.compat.weaver import listing, operations, schemas
from gateway.compat.weaver.errors import PREFIX, WeaverRoute
from gateway.compat.weaver.service import WeaverService, public_sampling, public_session
from services.common.deps import app_state
from services.common.errors import InvalidInput, NotFound

WeaverDep = Annotated[WeaverService, Depends(app_state("weaver"))]


async def json_body(request: Request) -> None:
    """The SDK's opt-in binary tensor transport sends multipart bodies, which Loom does not
    read: say so instead of failing to parse them."""
    if request.headers.get("content-type", "").startswith("multipart/"):
        raise InvalidInput(
            "The http-binary tensor transport is not served by Loom: leave "
            "WEAVER_TENSOR_TRANSPORT unset (the default sends JSON)."
        )


# Every route is async: the service's state and operations live on the event loop.
router = APIRouter(
    prefix=f"{PREFIX}/api/v1",
    tags=["weaver"],
    route_class=WeaverRoute,
    dependencies=[Depends(json_body)],
)


@router.post("/sessions", status_code=status.HTTP_201_CREATED)
async def create_session(
    body: schemas.CreateSession, weaver: WeaverDep, key: CurrentKey
) -> schemas.SessionInfo:
    return await weaver.create_session(body, key)


@router.get("/sessions/{session_id}")
async def get_session(session_id: str, weaver: WeaverDep, key: CurrentKey) -> schemas.SessionInfo:
    return public_session(session_id, await weaver.session(session_id, key))


@router.post("/sessions/{session_id}/heartbeat")
async def heartbeat(session_id: str, weaver: WeaverDep, key: CurrentKey) -> schemas.SessionAlive:
    await weaver.session(session_id, key)
    return schemas.SessionAlive(id=session_id)


@router.post("/sessions/{session_id}/metrics")
async def log_metrics(
    session_id: str, body: schemas.LogMetrics, weaver: WeaverDep, key: CurrentKey
) -> schemas.MetricsAccepted:
    return await weaver.log_metrics(session_id, body, key)


@router.get("/supported-models")
async def supported_models(
    weaver: WeaverDep, _key: CurrentKey, limit: Limit = 100, offset: Offset = 0
) -> schemas.Catalog:
    return await listing.catalog(weaver, limit, offset)


@router.get("/model-catalog")
async def model_catalog(
    weaver: WeaverDep, _key: CurrentKey, limit: Limit = 100, offset: Offset = 0
) -> schemas.Catalog:
    """The detailed list (`list_supported_models(detailed=True)`): each mode priced at 0."""
    return await listing.catalog(weaver, limit, offset)


@router.get("/models")
async def list_models(
    weaver: WeaverDep, key: CurrentKey, limit: Limit = 25, offset: Offset = 0
) -> schemas.ModelPage:
    return await listing.model_page(weaver, key, limit, offset)


@router.get("/training-runs")
async def list_training_runs(
    weaver: WeaverDep, key: CurrentKey, limit: Limit = 25, offset: Offset = 0
) -> schemas.ModelPage:
    """A training run is a training model: the same items as GET /models."""
    return await listing.model_page(weaver, key, limit, offset)


@router.get("/training-runs/{model_id}")
async def get_training_run(
    model_id: str, weaver: WeaverDep, key: CurrentKey
) -> schemas.TrainingRunDetail:
    return await listing.training_run(weaver, model_id, key)


@router.post("/sessions/{session_id}/models", status_code=status.HTTP_201_CREATED)
async def create_model(
    session_id: str, body: schemas.CreateModel, weaver: WeaverDep, key: CurrentKey
) -> schemas.TrainingModel:
    return await weaver.create_model(session_id, body, key)


@router.get("/models/{model_id}")
async def get_model(model_id: str, weaver: WeaverDep, key: CurrentKey) -> schemas.TrainingModel:
    return (await weaver.model(model_id, key)).public()


@router.post("/models/{model_id}/terminate")
async def terminate(model_id: str, weaver: WeaverDep, key: CurrentKey) -> schemas.Terminated:
    return await weaver.terminate(model_id, key)


@router.post("/models/{model_id}/forward-passes", response_model_exclude_unset=True)
async def forward(
    model_id: str, body: schemas.PassBody, weaver: WeaverDep, key: CurrentKey
) -> schemas.Operation:
    op_id = await weaver.forward(model_id, body, key, backward=False)
    return await operations.submitted(weaver.futures, op_id)


@router.post("/models/{model_id}/forward-backward-passes", response_model_exclude_unset=True)
async def forward_backward(
    model_id: str, body: schemas.PassBody, weaver: WeaverDep, key: CurrentKey
) -> schemas.Operation:
    op_id = await weaver.forward(model_id, body, key, backward=True)
    return await operations.submitted(weaver.futures, op_id)


@router.post("/models/{model_id}/optimizer-steps", response_model_exclude_unset=True)
async def optim_step(
    model_id: str, body: schemas.OptimBody, weaver: WeaverDep, key: CurrentKey
) -> schemas.Operation:
    op_id = await weaver.optim_step(model_id, body, key)
    return await operations.submitted(weaver.futures, op_id)


@router.post("/models/{model_id}/export-sampler", response_model_exclude_unset=True)
async def export_sampler(
    model_id: str, body: schemas.ExportSampler, weaver: WeaverDep, key: CurrentKey
) -> schemas.Operation:
    op_id = await weaver.export_sampler(model_id, body, key)
    return await operations.submitted(weaver.futures, op_id)


@router.post("/models/{model_id}/checkpoints", response_model_exclude_unset=True)
async def save_checkpoint(
    model_id: str, body: schemas.SaveCheckpoint, weaver: WeaverDep, key: CurrentKey
) -> schemas.Operation:
    op_id = await weaver.save_checkpoint(model_id, body, key)
    return await operations.submitted(weaver.futures, op_id)


@router.get("/models/{model_id}/checkpoints")
async def list_checkpoints(
    model_id: str, weaver: WeaverDep, key: CurrentKey
) -> schemas.Checkpoints:
    return await weaver.list_checkpoints(model_id, key)


@router.post("/models/{model_id}/load", response_model_exclude_unset=True)
async def load_checkpoint(
    model_id: str, body: schemas.LoadCheckpoint, weaver: WeaverDep, key: CurrentKey
) -> schemas.Operation:
    op_id = await weaver.load_checkpoint(model_id, body, key)
    return await operations.submitted(weaver.futures, op_id)


@router.post("/sessions/{session_id}/sampling-sessions", status_code=status.HTTP_201_CREATED)
async def create_sampling_session(
    session_id: str, body: schemas.CreateSamplingSession, weaver: WeaverDep, key: CurrentKey
) -> schemas.SamplingSession:
    return await weaver.create_sampling_session(session_id, body, key)


@router.get("/sampling-sessions/{sampling_id}")
async def get_sampling_session(
    sampling_id: str, weaver: WeaverDep, key: CurrentKey
) -> schemas.SamplingSession:
    return public_sampling(sampling_id, await weaver.sampling_session(sampling_id, key))


@router.delete("/sampling-sessions/{sampling_id}", status_code=status.HTTP_204_NO_CONTENT)
async def close_sampling_session(sampling_id: str, weaver: WeaverDep, key: CurrentKey) -> None:
    await weaver.close_sampling_session(sampling_id, key)


@router.post("/sampling-sessions/{sampling_id}/samples", response_model_exclude_unset=True)
async def sample(
    sampling_id: str, body: schemas.SampleBody, weaver: WeaverDep, key: CurrentKey
) -> schemas.Operation:
    op_id = await weaver.sample(sampling_id, body, key)
    return await operations.submitted(weaver.futures, op_id)


@router.post("/sampling-sessions/{sampling_id}/logprobs", response_model_exclude_unset=True)
async def compute_logprobs(
    sampling_id: str, body: schemas.LogprobsBody, weaver: WeaverDep, key: CurrentKey
) -> schemas.Operation:
    op_id = await weaver.compute_logprobs(sampling_id, body, key)
    return await operations.submitted(weaver.futures, op_id)


@router.get("/operations/{op_id}", response_model_exclude_unset=True)
async def get_operation(op_id: str, weaver: WeaverDep, _key: CurrentKey) -> schemas.Operation:
    return await operations.poll(weaver.futures, op_id)


# Not an operation of the API, so not in its OpenAPI description (one route, five methods).
@router.api_route(
    "/{call:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False
)
async def unsupported(call: str, request: Request, _key: CurrentKey) -> None:
    """Calls Loom does not serve fail at once in the SDK's own error shape, never hang."""
    raise NotFound(
        f"Loom does not serve the Weaver call {request.method} /api/v1/{call} "
        "(see the README: Using Loom with the Weaver or Tinker SDK)."
    )
