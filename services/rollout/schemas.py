"""Wire models of the rollout service's own API (the OpenAI-compatible ones live in
`services/rollout/openai/`)."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from modelstate.schemas import JobId
from services.common.schemas import LenientModel, StrictModel

VersionRef = int | str  # a version number (0 is the base model) or an alias such as "latest"


class SamplingParams(StrictModel):
    max_tokens: int = Field(default=64, ge=1, le=32768)
    temperature: float = Field(default=1.0, ge=0, le=10)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=-1, ge=-1)
    stop: list[str] = Field(default=[], max_length=16)
    seed: int | None = None


class SampleRequest(StrictModel):
    job_id: JobId | None = Field(default=None, description="None: the base model")
    version: VersionRef = "latest"
    prompt: str | None = Field(default=None, max_length=1_000_000)
    prompt_token_ids: list[int] | None = Field(default=None, max_length=131072)
    n: int = Field(default=1, ge=1, le=256)
    params: SamplingParams = SamplingParams()

    @model_validator(mode="after")
    def _one_prompt(self) -> Self:
        if (self.prompt is None) == (self.prompt_token_ids is None):
            raise ValueError("give exactly one of prompt or prompt_token_ids")
        if self.prompt_token_ids is not None and not self.prompt_token_ids:
            raise ValueError("prompt_token_ids must not be empty")
        return self


class Sample(LenientModel):
    token_ids: list[int]
    logprobs: list[float]
    text: str
    stop_reason: Literal["stop", "length", "abort"]
    version: int


class SampleResponse(LenientModel):
    job_id: str | None
    version: int
    prompt_token_ids: list[int]
    samples: list[Sample]


class TokenizeRequest(StrictModel):
    texts: list[str] = Field(min_length=1, max_length=4096)
    add_special_tokens: bool = False


class TokenizeResponse(LenientModel):
    token_ids: list[list[int]]


class LoadRequest(StrictModel):
    job_id: JobId
    version: VersionRef = "latest"


class LoadedVersion(LenientModel):
    job_id: str | None
    number: int
    kind: Literal["base", "full", "lora"]


class ResidentVersions(LenientModel):
    base_model: str
    full: LoadedVersion | None
    loras: list[LoadedVersion]
