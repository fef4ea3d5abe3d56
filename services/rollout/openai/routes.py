"""OpenAI-compatible routes: parse, call the serving objects, return JSON or an SSE stream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, TypeVar

from fastapi import APIRouter, Path
from fastapi.responses import StreamingResponse

from services.rollout.deps import ChatDep, CompletionsDep, OpenAIDep
from services.rollout.openai.schemas import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelList,
)

router = APIRouter(prefix="/v1", tags=["openai"])
TrajectoryId = Annotated[str, Path(max_length=64, description="From POST /v1/trajectories")]

STREAM_RESPONSES = {200: {"content": {"text/event-stream": {}}}}
Body = TypeVar("Body")


def _respond(result: Body | AsyncIterator[str]) -> Body | StreamingResponse:
    if isinstance(result, AsyncIterator):
        return StreamingResponse(
            result, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
    return result


@router.post("/completions", response_model=CompletionResponse, responses=STREAM_RESPONSES)
async def completions(
    serving: CompletionsDep, body: CompletionRequest
) -> CompletionResponse | StreamingResponse:
    return _respond(await serving.create(body))


@router.post("/chat/completions", response_model=ChatCompletionResponse, responses=STREAM_RESPONSES)
async def chat_completions(
    serving: ChatDep, body: ChatCompletionRequest
) -> ChatCompletionResponse | StreamingResponse:
    return _respond(await serving.create(body))


# Inside a trajectory: an agent's OpenAI base URL is `.../v1/trajectories/<id>`, so every call
# it makes is recorded there, whatever `model` it names.
@router.post(
    "/trajectories/{trajectory_id}/completions",
    response_model=CompletionResponse,
    responses=STREAM_RESPONSES,
)
async def trajectory_completions(
    serving: CompletionsDep, trajectory_id: TrajectoryId, body: CompletionRequest
) -> CompletionResponse | StreamingResponse:
    return _respond(await serving.create(body, trajectory_id))


@router.post(
    "/trajectories/{trajectory_id}/chat/completions",
    response_model=ChatCompletionResponse,
    responses=STREAM_RESPONSES,
)
async def trajectory_chat_completions(
    serving: ChatDep, trajectory_id: TrajectoryId, body: ChatCompletionRequest
) -> ChatCompletionResponse | StreamingResponse:
    return _respond(await serving.create(body, trajectory_id))


@router.get("/models", response_model=ModelList)
async def models(serving: OpenAIDep) -> ModelList:
    return serving.models()
