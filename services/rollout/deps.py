"""Typed dependencies: the long-lived objects `create_app`'s lifespan puts on `app.state`."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from services.rollout.openai.chat import ChatCompletions
from services.rollout.openai.completions import Completions
from services.rollout.openai.serving import OpenAIServing
from services.rollout.sampling import Sampler
from services.rollout.versions import Versions


def get_sampler(request: Request) -> Sampler:
    return request.app.state.sampler  # type: ignore[no-any-return]


def get_versions(request: Request) -> Versions:
    return request.app.state.versions  # type: ignore[no-any-return]


def get_openai(request: Request) -> OpenAIServing:
    return request.app.state.openai  # type: ignore[no-any-return]


def get_completions(request: Request) -> Completions:
    return request.app.state.completions  # type: ignore[no-any-return]


def get_chat(request: Request) -> ChatCompletions:
    return request.app.state.chat  # type: ignore[no-any-return]


SamplerDep = Annotated[Sampler, Depends(get_sampler)]
VersionsDep = Annotated[Versions, Depends(get_versions)]
OpenAIDep = Annotated[OpenAIServing, Depends(get_openai)]
CompletionsDep = Annotated[Completions, Depends(get_completions)]
ChatDep = Annotated[ChatCompletions, Depends(get_chat)]
