"""Typed dependencies: the long-lived objects `create_app`'s lifespan puts on `app.state`."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from services.common.deps import app_state
from services.rollout.announce import Announcer
from services.rollout.capture import Capture
from services.rollout.fanout import HeldFiles
from services.rollout.openai.chat import ChatCompletions
from services.rollout.openai.completions import Completions
from services.rollout.openai.serving import OpenAIServing
from services.rollout.rollouts import Rollouts
from services.rollout.sampling import Sampler
from services.rollout.versions import Versions

SamplerDep = Annotated[Sampler, Depends(app_state("sampler"))]
VersionsDep = Annotated[Versions, Depends(app_state("versions"))]
OpenAIDep = Annotated[OpenAIServing, Depends(app_state("openai"))]
CompletionsDep = Annotated[Completions, Depends(app_state("completions"))]
ChatDep = Annotated[ChatCompletions, Depends(app_state("chat"))]
RolloutsDep = Annotated[Rollouts, Depends(app_state("rollouts"))]
CaptureDep = Annotated[Capture, Depends(app_state("capture"))]
AnnouncerDep = Annotated[Announcer, Depends(app_state("announcer"))]
HeldFilesDep = Annotated[HeldFiles, Depends(app_state("held_files"))]
