"""`POST /v1/chat/completions`: chat with the tokenizer's chat template, on any Loom version.
(Tool calls come later.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

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
    TokenLogprob,
    TopLogprob,
)
from services.rollout.openai.serving import (
    OpenAIServing,
    Prepared,
    loom_choice,
    sse,
    token_text,
    top_entries,
    usage,
)
from services.rollout.sampling import stop_reason, vllm_params
from services.rollout.schemas import SamplingParams

if TYPE_CHECKING:
    from vllm.outputs import CompletionOutput


class ChatCompletions:
    def __init__(self, serving: OpenAIServing) -> None:
        self.serving = serving
        self.sampler = serving.sampler

    def render(self, request: ChatCompletionRequest) -> list[int]:
        engine = self.sampler.engine
        text = engine.tokenizer.apply_chat_template(
            [m.template_dict() for m in request.messages], tokenize=False,
            add_generation_prompt=True,
        )
        return engine.encode(text, add_special_tokens=False)

    async def create(
        self, request: ChatCompletionRequest
    ) -> ChatCompletionResponse | AsyncIterator[str]:
        prompt = self.render(request)
        room = self.sampler.engine.max_model_len - len(prompt)
        max_tokens = request.max_completion_tokens or request.max_tokens or max(1, room)
        params = vllm_params(
            SamplingParams(max_tokens=min(max_tokens, MAX_TOKENS),
                           temperature=request.temperature, top_p=request.top_p,
                           stop=request.stop_list, seed=request.seed),
            n=request.n, logprobs=request.top_logprobs or 0, stream=request.stream,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
        )
        prepared = await self.serving.prepare(request.model, [prompt], params, "chatcmpl")
        top = (request.top_logprobs or 0) if request.logprobs else None
        if request.stream:
            include_usage = bool(request.stream_options and request.stream_options.include_usage)
            return sse(self._chunks(prepared, top, include_usage))
        (output,) = await self.serving.generate(prepared)
        choices = [
            ChatChoice(index=c.index, message=AssistantMessage(content=c.text),
                       logprobs=self._logprobs(c, top), finish_reason=stop_reason(c),
                       loom=loom_choice(c))
            for c in sorted(output.outputs, key=lambda c: c.index)
        ]
        return ChatCompletionResponse(
            id=prepared.id, created=prepared.created, model=prepared.model, choices=choices,
            usage=usage(prepared.prompts, output.outputs), loom=prepared.loom(),
        )

    async def _chunks(self, prepared: Prepared, top: int | None,
                      include_usage: bool) -> AsyncIterator[ChatCompletionChunk]:
        def chunk(choices: list[ChatChunkChoice], **extra: object) -> ChatCompletionChunk:
            return ChatCompletionChunk(id=prepared.id, created=prepared.created,
                                       model=prepared.model, choices=choices,
                                       loom=prepared.loom(with_prompts=False), **extra)

        # OpenAI opens each choice with the assistant's role and no content yet.
        yield chunk([ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))
                     for i in range(prepared.params.n)]).model_copy(
                         update={"loom": prepared.loom()})
        completions: list[CompletionOutput] = []
        async for _, delta in self.serving.stream(prepared):
            completions.append(delta)
            finished = delta.finished()
            yield chunk([ChatChunkChoice(
                index=delta.index, delta=ChatDelta(content=delta.text),
                logprobs=self._logprobs(delta, top),
                finish_reason=stop_reason(delta) if finished else None,
                loom=loom_choice(delta),
            )])
        if include_usage:
            yield chunk([], usage=usage(prepared.prompts, completions))

    def _logprobs(self, completion: CompletionOutput, top: int | None) -> ChatLogprobs | None:
        if top is None:
            return None
        content = []
        for token_id, entry in zip(completion.token_ids, completion.logprobs or [],
                                   strict=True):
            text = token_text(entry[token_id], token_id, self.sampler)
            content.append(TokenLogprob(
                token=text, logprob=entry[token_id].logprob, bytes=list(text.encode()),
                top_logprobs=[
                    TopLogprob(token=(t := token_text(lp, tid, self.sampler)),
                               logprob=lp.logprob, bytes=list(t.encode()))
                    for tid, lp in top_entries(entry, top)
                ],
            ))
        return ChatLogprobs(content=content)
