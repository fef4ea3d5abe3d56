"""Loom's own rollout API: parse, call the logic, return."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Response
from fastapi.responses import FileResponse, StreamingResponse

from services.common.errors import NotFound
from services.rollout.arriving import arriving_response
from services.rollout.deps import (
    AnnouncerDep,
    CaptureDep,
    HeldFilesDep,
    RolloutsDep,
    SamplerDep,
    VersionsDep,
)
from services.rollout.fanout import SHA256_PATTERN
from services.rollout.openai.routes import TrajectoryId
from services.rollout.schemas import (
    CapturedTrajectory,
    LoadedVersion,
    LoadRequest,
    RenderRequest,
    RenderResponse,
    ResidentVersions,
    RolloutEvent,
    RolloutRequest,
    SampleBatchRequest,
    SampleBatchResponse,
    SampleRequest,
    SampleResponse,
    TokenizeRequest,
    TokenizeResponse,
    TrajectoryCreate,
    TrajectoryInfo,
)

router = APIRouter(prefix="/v1", tags=["rollout"])


@router.post("/sample", response_model=SampleResponse)
async def sample(sampler: SamplerDep, body: SampleRequest) -> SampleResponse:
    return await sampler.sample(body)


@router.post("/sample/batch", response_model=SampleBatchResponse)
async def sample_batch(sampler: SamplerDep, body: SampleBatchRequest) -> SampleBatchResponse:
    """Many prompts on one version in one request: the engine batches them all at once."""
    return await sampler.sample_batch(body)


@router.post("/tokenize", response_model=TokenizeResponse)
async def tokenize(sampler: SamplerDep, body: TokenizeRequest) -> TokenizeResponse:
    return sampler.tokenize(body)


@router.get("/versions", response_model=ResidentVersions)
async def resident_versions(versions: VersionsDep) -> ResidentVersions:
    return versions.resident()


@router.post("/load", response_model=LoadedVersion)
async def load(versions: VersionsDep, body: LoadRequest) -> LoadedVersion:
    return await versions.load(body.job_id, body.version)


@router.post(
    "/rollouts",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "One RolloutEvent per line, each group as it completes, then a summary.",
            "content": {"application/x-ndjson": {"schema": RolloutEvent.model_json_schema()}},
        }
    },
)
async def rollouts(runner: RolloutsDep, body: RolloutRequest) -> StreamingResponse:
    return StreamingResponse(await runner.start(body), media_type="application/x-ndjson")


@router.post("/render", response_model=RenderResponse)
async def render(runner: RolloutsDep, body: RenderRequest) -> RenderResponse:
    return runner.render(body)


@router.post("/trajectories", response_model=TrajectoryInfo, status_code=201)
async def create_trajectory(capture: CaptureDep, body: TrajectoryCreate) -> TrajectoryInfo:
    return await capture.create(body)


@router.get("/trajectories/{trajectory_id}", response_model=CapturedTrajectory)
async def get_trajectory(
    capture: CaptureDep, sampler: SamplerDep, trajectory_id: TrajectoryId
) -> CapturedTrajectory:
    return await capture.get(trajectory_id, sampler.engine.decode)


@router.delete("/trajectories/{trajectory_id}", status_code=204)
async def delete_trajectory(capture: CaptureDep, trajectory_id: TrajectoryId) -> Response:
    await capture.delete(trajectory_id)
    return Response(status_code=204)


@router.post("/drain", status_code=204)
async def drain(announcer: AnnouncerDep) -> Response:
    """Leave the gateway's routing table for good (scaling down): running requests finish,
    nothing new is routed here. Stop the process afterwards."""
    await announcer.drain()
    return Response(status_code=204)


@router.get(
    "/blobs/{sha256}",
    response_class=FileResponse,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
async def blob(
    held: HeldFilesDep,
    sha256: Annotated[str, Path(pattern=SHA256_PATTERN)],
    range_header: Annotated[str | None, Header(alias="range")] = None,
) -> Response:
    """A file of a version this replica holds, or is fetching (served as it arrives), by
    content, for a peer replica fetching the version (`services.rollout.fanout`); Range
    requests are honoured, so a fetch resumes."""
    path = held.path(sha256)
    if path is not None:
        return FileResponse(path, media_type="application/octet-stream")
    arriving = held.arriving.get(sha256)
    if arriving is None:
        raise NotFound(f"This replica holds no file with sha256 {sha256}.", {"sha256": sha256})
    return arriving_response(arriving, range_header)
