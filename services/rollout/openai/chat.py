"""`POST /v1/chat/completions`: chat with the model's chat template, tool calls included, on
any Loom version; inside a trajectory, every completion is recorded for training."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.rollout.capture import NewCall, Recording
from services.rollout.chat_format import Message
from services.rollout.openai.schemas import (
    MAX_TOKENS,
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    FinishReason,
    TokenLogprob,
    TopLogprob,
)
from services.rollout.openai.serving import (
    Accumulated,
    OpenAIServing,
    Prepared,
    accumulated,
    loom_choice,
    sse,
    token_text,
    usage,
)
from services.rollout.openai.tools import (
    ReplyStream,
    split_reply,
    template_messages,
    template_tools,
)
from services.rollout.sampling import stop_reason, top_entries, vllm_params
from services.rollout.schemas import SamplingParams

if TYPE_CHECKING:
    from vllm.outputs import CompletionOutput


@dataclass
class Conversation:
    """A request as the template takes it, and where its prompt came from."""

    messages: list[Message]
    tools: list[dict[str, object]] | None
    prompt: list[int]
    parent: int | None = None
    recording: Recording | None = None

    def call(self, prepared: Prepared, choice: Accumulated) -> NewCall:
        reply = split_reply(choice.text, self.tools is not None)
        return NewCall(
            endpoint="chat",
            version=prepared.target.number,
            prompt_token_ids=self.prompt,
            token_ids=choice.token_ids,
            logprobs=choice.logprobs,
            finish_reason=choice.finish_reason,
            text=choice.text,
            parent=self.parent,
            messages=self.messages,
            tools=self.tools,
            reply=reply.template_message(),
        )


def openai_finish(reason: str, called_tools: bool) -> FinishReason:
    """OpenAI says `tool_calls` when a reply that ended by itself asks for tools."""
    return "tool_calls" if called_tools and reason == "stop" else reason  # type: ignore


class ChatCompletions:
    def __init__(self, serving: OpenAIServing) -> None:
        self.serving = serving
        self.sampler = serving.sampler

    @property
    def turn_end_ids(self) -> list[int]:
        """A reply ends where the template closes the assistant's turn, whatever the model's
        end-of-sequence token is."""
        turn_end = self.serving.chat.turn_end_id
        return [] if turn_end is None else [turn_end]

    async def conversation(
        self, request: ChatCompletionRequest, trajectory_id: str | None
    ) -> Conversation:
        messages = template_messages(request.messages)
        # With tool_choice "none" the model is not told about the tools.
        tools = template_tools(request.tools) if request.offers_tools else None
        recording = await self.serving.recording(trajectory_id)
        if recording is None:
            return Conversation(messages, tools, self.serving.chat.prompt_ids(messages, tools))
        prompt, parent = recording.chat_prompt(self.serving.chat, messages, tools)
        return Conversation(messages, tools, prompt, parent, recording)

    async def create(
        self, request: ChatCompletionRequest, trajectory_id: str | None = None
    ) -> ChatCompletionResponse | AsyncIterator[str]:
        conversation = await self.conversation(request, trajectory_id)
        room = self.sampler.engine.max_model_len - len(conversation.prompt)
        max_tokens = request.max_completion_tokens or request.max_tokens or max(1, room)
        params = vllm_params(
            SamplingParams(
                max_tokens=min(max_tokens, MAX_TOKENS),
                temperature=request.temperature,
                top_p=request.top_p,
                stop=request.stop_list,
                seed=request.seed,
                stop_token_ids=self.turn_end_ids,
            ),
            n=request.n,
            logprobs=request.top_logprobs or 0,
            stream=request.stream,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            # Tool-call markup may be special tokens (it is in the tiny model's vocabulary).
            skip_special_tokens=conversation.tools is None,
        )
        prepared = await self.serving.prepare(
            request.model, [conversation.prompt], params, "chatcmpl", conversation.recording
        )
        top = (request.top_logprobs or 0) if request.logprobs else None
        if request.stream:
            include_usage = bool(request.stream_options and request.stream_options.include_usage)
            return sse(self._chunks(prepared, conversation, top, include_usage))
        (output,) = await self.serving.generate(prepared)
        completions = sorted(output.outputs, key=lambda c: c.index)
        replies = [split_reply(c.text, conversation.tools is not None) for c in completions]
        if conversation.recording is not None:
            await conversation.recording.record(
                [
                    conversation.call(prepared, accumulated(conversation.prompt, c))
                    for c in completions
                ]
            )
        choices = [
            ChatChoice(
                index=c.index,
                message=AssistantMessage(
                    content=reply.content, tool_calls=reply.tool_calls or None
                ),
                logprobs=self._logprobs(c, top),
                finish_reason=openai_finish(stop_reason(c), bool(reply.tool_calls)),
                loom=loom_choice(c),
            )
            for c, reply in zip(completions, replies, strict=True)
        ]
        return ChatCompletionResponse(
            id=prepared.id,
            created=prepared.created,
            model=prepared.model,
            choices=choices,
            usage=usage(prepared.prompts, output.outputs),
            loom=prepared.loom(),
        )

    async def _chunks(
        self, prepared: Prepared, conversation: Conversation, top: int | None, include_usage: bool
    ) -> AsyncIterator[ChatCompletionChunk]:
        def chunk(choices: list[ChatChunkChoice], **extra: object) -> ChatCompletionChunk:
            return ChatCompletionChunk(
                id=prepared.id,
                created=prepared.created,
                model=prepared.model,
                choices=choices,
                loom=prepared.loom(with_prompts=False),
                **extra,
            )

        # OpenAI opens each choice with the assistant's role and no content yet.
        yield chunk(
            [
                ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))
                for i in range(prepared.params.n)
            ]
        ).model_copy(update={"loom": prepared.loom()})
        streamed = [Accumulated(conversation.prompt) for _ in range(prepared.params.n)]
        replies = [ReplyStream(conversation.tools is not None) for _ in streamed]
        completions: list[CompletionOutput] = []
        async for _, delta in self.serving.stream(prepared):
            completions.append(delta)
            streamed[delta.index].add(delta)
            reply = replies[delta.index]
            content = reply.push(delta.text)
            tool_calls = None
            finish_reason = None
            if delta.finished():
                rest, calls = reply.finish()
                content += rest
                tool_calls = calls or None
                finish_reason = openai_finish(stop_reason(delta), bool(calls))
            yield chunk(
                [
                    ChatChunkChoice(
                        index=delta.index,
                        delta=ChatDelta(content=content, tool_calls=tool_calls),
                        logprobs=self._logprobs(delta, top),
                        finish_reason=finish_reason,
                        loom=loom_choice(delta),
                    )
                ]
            )
        if conversation.recording is not None:
            await conversation.recording.record(
                [conversation.call(prepared, choice) for choice in streamed]
            )
        if include_usage:
            yield chunk([], usage=usage(prepared.prompts, completions))

    def _logprobs(self, completion: CompletionOutput, top: int | None) -> ChatLogprobs | None:
        if top is None:
            return None
        content = []
        for token_id, entry in zip(completion.token_ids, completion.logprobs or [], strict=True):
            text = token_text(entry[token_id], token_id, self.sampler)
            content.append(
                TokenLogprob(
                    token=text,
                    logprob=entry[token_id].logprob,
                    bytes=list(text.encode()),
                    top_logprobs=[
                        TopLogprob(
                            token=(t := token_text(lp, tid, self.sampler)),
                            logprob=lp.logprob,
                            bytes=list(t.encode()),
                        )
                        for tid, lp in top_entries(entry, top)
                    ],
                )
            )
        return ChatLogprobs(content=content)
