"""OpenAI wire models for `/v1/completions`, `/v1/chat/completions` and `/v1/models`, field
for field as OpenAI names them, plus a `loom` extension (token ids, sampled logprobs, version).
Requests are strict, as OpenAI's own API rejects unknown arguments."""

from __future__ import annotations

import re
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from services.common.schemas import LenientModel, StrictModel

FinishReason = Literal["stop", "length", "abort", "tool_calls"]
MAX_TOKENS = 32768  # as Loom's own SamplingParams allows
JOB_MODEL = re.compile(r"^(?P<job>[A-Za-z0-9][A-Za-z0-9._-]*)(?:@(?P<ref>[A-Za-z0-9_.-]+))?$")
BASE_ALIAS = "base"


def job_model(model: str) -> tuple[str, str | None] | None:
    """`<job_id>` or `<job_id>@<number or alias>` as (job, ref or None); None for another
    spelling (a base model's name, say). The gateway routes by it too."""
    match = JOB_MODEL.match(model)
    return None if match is None else (match["job"], match["ref"])


class StreamOptions(StrictModel):
    include_usage: bool = False


class _SamplingFields(StrictModel):
    model: str = Field(min_length=1, max_length=300)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=128)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else self.stop


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1, le=MAX_TOKENS)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: Literal[False] = False

    @property
    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: OpenAI accepts one prompt or a batch of them."""
        if isinstance(self.prompt, str) or (self.prompt and isinstance(self.prompt[0], int)):
            return [self.prompt]  # type: ignore[list-item]
        return list(self.prompt)  # type: ignore[arg-type]

    @model_validator(mode="after")
    def _nonempty(self) -> Self:
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt must not be an empty list")
        return self


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class FunctionDef(StrictModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] = {}
    strict: bool | None = None


class ToolDef(StrictModel):
    type: Literal["function"]
    function: FunctionDef


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: dict[str, str]


class FunctionCall(LenientModel):
    name: str
    arguments: str = Field(description="JSON-encoded, as OpenAI sends it")


class ToolCallOut(LenientModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallOut] | None = Field(default=None, max_length=64)
    tool_call_id: str | None = None
    refusal: str | None = None  # OpenAI echoes it on assistant messages; nothing to render

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""

    @model_validator(mode="after")
    def _roles(self) -> Self:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id it answers")
        return self


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[ToolDef] | None = Field(default=None, max_length=128)
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self) -> Self:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs: true")
        return self

    @model_validator(mode="after")
    def _tool_choice(self) -> Self:
        if self.tool_choice not in (None, "auto", "none"):
            raise ValueError(
                "tool_choice may be 'auto' or 'none': Loom samples exactly what "
                "the model writes, so it cannot force a tool call"
            )
        return self

    @property
    def offers_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


# --- responses ----------------------------------------------------------------------------


class Usage(LenientModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class LoomChoice(LenientModel):
    """Loom's extension on a choice: exactly what RL training needs of the sample."""

    token_ids: list[int]
    logprobs: list[float]


class LoomInfo(LenientModel):
    """Loom's extension on a response: which version answered, and the prompt's tokens."""

    job_id: str | None
    version: int
    prompt_token_ids: list[list[int]] | None = None
    trajectory_id: str | None = Field(default=None, description="Where the call was recorded")


class CompletionLogprobs(LenientModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(LenientModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None = None
    loom: LoomChoice


class CompletionResponse(LenientModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    loom: LoomInfo


class TopLogprob(LenientModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(LenientModel):
    content: list[TokenLogprob]


class AssistantMessage(LenientModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(LenientModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None
    loom: LoomChoice


class ChatCompletionResponse(LenientModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    loom: LoomInfo


class ToolCallDelta(ToolCallOut):
    index: int


class ChatDelta(LenientModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(LenientModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None
    loom: LoomChoice | None = None


class ChatCompletionChunk(LenientModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    loom: LoomInfo


class ModelCard(LenientModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "loom"
    root: str | None = None
    loom: dict[str, Any] = {}


class ModelList(LenientModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
