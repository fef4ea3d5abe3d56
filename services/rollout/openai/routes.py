"""OpenAI-compatible routes: parse, call the serving objects, return JSON or an SSE stream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TypeVar

from fastapi import APIRouter
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

STREAM_RESPONSES = {200: {"content": {"text/event-stream": {}}}}
Body = TypeVar("Body")


def _respond(result: Body | AsyncIterator[str]) -> Body | StreamingResponse:
    if isinstance(result, AsyncIterator):
        return StreamingResponse(result, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return result


@router.post("/completions", response_model=CompletionResponse, responses=STREAM_RESPONSES)
async def completions(serving: CompletionsDep,
                      body: CompletionRequest) -> CompletionResponse | StreamingResponse:
    return _respond(await serving.create(body))


@router.post("/chat/completions", response_model=ChatCompletionResponse,
             responses=STREAM_RESPONSES)
async def chat_completions(
    serving: ChatDep, body: ChatCompletionRequest
) -> ChatCompletionResponse | StreamingResponse:
    return _respond(await serving.create(body))


@router.get("/models", response_model=ModelList)
async def models(serving: OpenAIDep) -> ModelList:
    return serving.models()
