"""The rollout service's typed client: one method per JSON route. The streamed routes (the
NDJSON of `POST /v1/rollouts`, the OpenAI-compatible endpoints) are read by the SDK's stream and
OpenAI clients; a version's file by content (`BLOB`) by a peer replica's fan-out."""

from __future__ import annotations

from services.common.http import Route, ServiceClient
from services.rollout.schemas import (
    CapturedTrajectory,
    LoadedVersion,
    LoadRequest,
    RenderRequest,
    RenderResponse,
    ResidentVersions,
    SampleBatchRequest,
    SampleBatchResponse,
    SampleRequest,
    SampleResponse,
    TokenizeRequest,
    TokenizeResponse,
    TrajectoryCreate,
    TrajectoryInfo,
)

SAMPLE = Route("POST", "/v1/sample", SampleResponse, SampleRequest)
SAMPLE_BATCH = Route("POST", "/v1/sample/batch", SampleBatchResponse, SampleBatchRequest)
TOKENIZE = Route("POST", "/v1/tokenize", TokenizeResponse, TokenizeRequest)
RESIDENT_VERSIONS = Route("GET", "/v1/versions", ResidentVersions)
LOAD = Route("POST", "/v1/load", LoadedVersion, LoadRequest)
RENDER = Route("POST", "/v1/render", RenderResponse, RenderRequest)
CREATE_TRAJECTORY = Route("POST", "/v1/trajectories", TrajectoryInfo, TrajectoryCreate)
GET_TRAJECTORY = Route("GET", "/v1/trajectories/{trajectory_id}", CapturedTrajectory)
DELETE_TRAJECTORY: Route[None] = Route("DELETE", "/v1/trajectories/{trajectory_id}", None)
DRAIN: Route[None] = Route("POST", "/v1/drain", None)
# Raw bytes, Range requests honoured: `services.rollout.fanout` downloads them.
BLOB: Route[None] = Route("GET", "/v1/blobs/{sha256}", None)


class RolloutClient(ServiceClient):
    SERVICE = "rollout"

    async def sample(self, request: SampleRequest) -> SampleResponse:
        return await self.call(SAMPLE, request)

    async def sample_batch(self, request: SampleBatchRequest) -> SampleBatchResponse:
        return await self.call(SAMPLE_BATCH, request)

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResponse:
        return await self.call(TOKENIZE, request)

    async def resident_versions(self) -> ResidentVersions:
        """The base model and the versions this replica holds loaded."""
        return await self.call(RESIDENT_VERSIONS)

    async def load(self, request: LoadRequest) -> LoadedVersion:
        return await self.call(LOAD, request)

    async def render(self, request: RenderRequest) -> RenderResponse:
        return await self.call(RENDER, request)

    async def create_trajectory(self, request: TrajectoryCreate) -> TrajectoryInfo:
        return await self.call(CREATE_TRAJECTORY, request)

    async def get_trajectory(self, trajectory_id: str) -> CapturedTrajectory:
        return await self.call(GET_TRAJECTORY, trajectory_id=trajectory_id)

    async def delete_trajectory(self, trajectory_id: str) -> None:
        await self.call(DELETE_TRAJECTORY, trajectory_id=trajectory_id)

    async def drain(self) -> None:
        """Leave the gateway's routing table for good (scaling down)."""
        await self.call(DRAIN)
