"""`POST /v1/completions`: OpenAI's legacy completions, on any Loom version; inside a
trajectory, every completion is recorded for training."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from services.rollout.capture import NewCall, Recording
from services.rollout.openai.schemas import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
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
from services.rollout.sampling import stop_reason, top_entries, vllm_params
from services.rollout.schemas import SamplingParams

if TYPE_CHECKING:
    from vllm.outputs import CompletionOutput


class Completions:
    def __init__(self, serving: OpenAIServing) -> None:
        self.serving = serving
        self.sampler = serving.sampler

    async def create(
        self, request: CompletionRequest, trajectory_id: str | None = None
    ) -> CompletionResponse | AsyncIterator[str]:
        recording = await self.serving.recording(trajectory_id)
        prompts = [
            self.sampler.engine.encode(p, add_special_tokens=True) if isinstance(p, str) else p
            for p in request.prompts
        ]
        params = vllm_params(
            SamplingParams(
                max_tokens=request.max_tokens or 16,
                temperature=request.temperature,
                top_p=request.top_p,
                stop=request.stop_list,
                seed=request.seed,
            ),
            n=request.n,
            logprobs=request.logprobs or 0,
            stream=request.stream,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
        )
        prepared = await self.serving.prepare(request.model, prompts, params, "cmpl", recording)
        if request.stream:
            include_usage = bool(request.stream_options and request.stream_options.include_usage)
            return sse(self._chunks(prepared, request.logprobs, include_usage, recording))
        outputs = await self.serving.generate(prepared)
        if recording is not None:
            await self._record(
                recording,
                prepared,
                [
                    accumulated(prompt, c)
                    for prompt, output in zip(prompts, outputs, strict=True)
                    for c in sorted(output.outputs, key=lambda c: c.index)
                ],
            )
        choices = [
            self._choice(prepared.choice_index(i, c.index), c, request.logprobs, 0)
            for i, output in enumerate(outputs)
            for c in output.outputs
        ]
        return CompletionResponse(
            id=prepared.id,
            created=prepared.created,
            model=prepared.model,
            choices=sorted(choices, key=lambda c: c.index),
            usage=usage(prepared.prompts, [c for o in outputs for c in o.outputs]),
            loom=prepared.loom(),
        )

    async def _record(
        self, recording: Recording, prepared: Prepared, choices: list[Accumulated]
    ) -> None:
        await recording.record(
            [
                NewCall(
                    endpoint="completions",
                    version=prepared.target.number,
                    prompt_token_ids=c.prompt,
                    token_ids=c.token_ids,
                    logprobs=c.logprobs,
                    finish_reason=c.finish_reason,
                    text=c.text,
                    parent=recording.token_parent(c.prompt),
                )
                for c in choices
            ]
        )

    async def _chunks(
        self,
        prepared: Prepared,
        logprobs: int | None,
        include_usage: bool,
        recording: Recording | None,
    ) -> AsyncIterator[CompletionResponse]:
        offsets: dict[int, int] = defaultdict(int)
        completions: list[CompletionOutput] = []
        streamed = {
            prepared.choice_index(i, j): Accumulated(prompt)
            for i, prompt in enumerate(prepared.prompts)
            for j in range(prepared.params.n)
        }
        first = True
        async for prompt_index, delta in self.serving.stream(prepared):
            index = prepared.choice_index(prompt_index, delta.index)
            streamed[index].add(delta)
            choice = self._choice(index, delta, logprobs, offsets[index])
            offsets[index] += len(delta.text)
            completions.append(delta)
            yield CompletionResponse(
                id=prepared.id,
                created=prepared.created,
                model=prepared.model,
                choices=[choice],
                loom=prepared.loom(with_prompts=first),
            )
            first = False
        if recording is not None:
            await self._record(recording, prepared, [streamed[i] for i in sorted(streamed)])
        if include_usage:
            yield CompletionResponse(
                id=prepared.id,
                created=prepared.created,
                model=prepared.model,
                choices=[],
                usage=usage(prepared.prompts, completions),
                loom=prepared.loom(with_prompts=False),
            )

    def _choice(
        self, index: int, completion: CompletionOutput, logprobs: int | None, offset: int
    ) -> CompletionChoice:
        return CompletionChoice(
            index=index,
            text=completion.text,
            logprobs=None if logprobs is None else self._logprobs(completion, logprobs, offset),
            finish_reason=stop_reason(completion) if completion.finished() else None,
            loom=loom_choice(completion),
        )

    def _logprobs(self, completion: CompletionOutput, k: int, offset: int) -> CompletionLogprobs:
        tokens: list[str] = []
        offsets: list[int] = []
        top: list[dict[str, float]] = []
        for token_id, entry in zip(completion.token_ids, completion.logprobs or [], strict=True):
            text = token_text(entry[token_id], token_id, self.sampler)
            tokens.append(text)
            offsets.append(offset)
            offset += len(text)
            top.append(
                {token_text(lp, t, self.sampler): lp.logprob for t, lp in top_entries(entry, k)}
            )
        return CompletionLogprobs(
            tokens=tokens,
            token_logprobs=loom_choice(completion).logprobs,
            top_logprobs=top if k else None,
            text_offset=offsets,
        )
