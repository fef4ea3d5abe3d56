"""Loom's own rollout API: parse, call the logic, return."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from services.rollout.deps import RolloutsDep, SamplerDep, VersionsDep
from services.rollout.schemas import (
    LoadedVersion,
    LoadRequest,
    RenderRequest,
    RenderResponse,
    ResidentVersions,
    RolloutEvent,
    RolloutRequest,
    SampleRequest,
    SampleResponse,
    TokenizeRequest,
    TokenizeResponse,
)

router = APIRouter(prefix="/v1", tags=["rollout"])


@router.post("/sample", response_model=SampleResponse)
async def sample(sampler: SamplerDep, body: SampleRequest) -> SampleResponse:
    return await sampler.sample(body)


@router.post("/tokenize", response_model=TokenizeResponse)
async def tokenize(sampler: SamplerDep, body: TokenizeRequest) -> TokenizeResponse:
    return sampler.tokenize(body)


@router.get("/versions", response_model=ResidentVersions)
async def resident_versions(versions: VersionsDep) -> ResidentVersions:
    return versions.resident()


@router.post("/load", response_model=LoadedVersion)
async def load(versions: VersionsDep, body: LoadRequest) -> LoadedVersion:
    return await versions.load(body.job_id, body.version)


@router.post("/rollouts", response_class=StreamingResponse, responses={200: {
    "description": "One RolloutEvent per line, each group as it completes, then a summary.",
    "content": {"application/x-ndjson": {"schema": RolloutEvent.model_json_schema()}}}})
async def rollouts(runner: RolloutsDep, body: RolloutRequest) -> StreamingResponse:
    return StreamingResponse(await runner.start(body), media_type="application/x-ndjson")


@router.post("/render", response_model=RenderResponse)
async def render(runner: RolloutsDep, body: RenderRequest) -> RenderResponse:
    return runner.render(body)
