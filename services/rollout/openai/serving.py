"""What the OpenAI endpoints share: the `model` field → a Loom version, prompts checked and
run on that version (whole or streamed), usage and the `loom` extension."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from services.common.errors import LoomError, NotFound
from services.common.schemas import ErrorBody, ErrorEnvelope, LenientModel
from services.rollout.capture import Capture, Recording
from services.rollout.chat_format import ChatFormat
from services.rollout.openai.schemas import (
    BASE_ALIAS,
    LoomChoice,
    LoomInfo,
    ModelCard,
    ModelList,
    Usage,
    job_model,
)
from services.rollout.sampling import (
    Sampler,
    check_weights,
    sampled_logprobs,
    stop_reason,
)
from services.rollout.schemas import VersionRef
from services.rollout.versions import LATEST, Target, Versions

if TYPE_CHECKING:
    import vllm
    from vllm.logprobs import Logprob
    from vllm.lora.request import LoRARequest
    from vllm.outputs import CompletionOutput, RequestOutput


@dataclass
class Prepared:
    """An OpenAI request checked and resolved, ready to run."""

    model: str
    target: Target
    prompts: list[list[int]]
    params: vllm.SamplingParams
    id: str
    created: int = field(default_factory=lambda: int(time.time()))

    trajectory_id: str | None = None

    def loom(self, with_prompts: bool = True) -> LoomInfo:
        return LoomInfo(
            job_id=self.target.job_id,
            version=self.target.number,
            prompt_token_ids=self.prompts if with_prompts else None,
            trajectory_id=self.trajectory_id,
        )

    def choice_index(self, prompt_index: int, completion_index: int) -> int:
        return prompt_index * self.params.n + completion_index


@dataclass
class Accumulated:
    """A streamed choice put back together, for the trajectory's recording."""

    prompt: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "abort"

    def add(self, delta: CompletionOutput) -> None:
        self.token_ids += delta.token_ids
        self.logprobs += sampled_logprobs(delta)
        self.text += delta.text
        if delta.finished():
            self.finish_reason = stop_reason(delta)


def accumulated(prompt: list[int], completion: CompletionOutput) -> Accumulated:
    """A whole (not streamed) choice, as the recording takes it."""
    choice = Accumulated(prompt)
    choice.add(completion)
    return choice


def loom_choice(completion: CompletionOutput) -> LoomChoice:
    return LoomChoice(token_ids=list(completion.token_ids), logprobs=sampled_logprobs(completion))


def usage(prompts: list[list[int]], completions: list[CompletionOutput]) -> Usage:
    prompt_tokens = sum(len(p) for p in prompts)
    completion_tokens = sum(len(c.token_ids) for c in completions)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


class OpenAIServing:
    def __init__(
        self, sampler: Sampler, versions: Versions, base_model: str, capture: Capture
    ) -> None:
        self.sampler = sampler
        self.versions = versions
        self.base_model = base_model
        self.capture = capture
        self._chat: ChatFormat | None = None

    @property
    def chat(self) -> ChatFormat:
        if self._chat is None:  # the tokenizer exists once the engine has started
            self._chat = ChatFormat(self.sampler.engine.tokenizer)
        return self._chat

    async def recording(self, trajectory_id: str | None) -> Recording | None:
        return None if trajectory_id is None else await self.capture.open(trajectory_id)

    def parse_model(self, model: str) -> tuple[str | None, VersionRef]:
        """`<base model>` or `base` → version 0; `<job_id>` → its latest version;
        `<job_id>@<number or alias>` → that version."""
        if model in (self.base_model, BASE_ALIAS):
            return None, 0
        parsed = job_model(model)
        if parsed is None:
            raise NotFound(
                f"Unknown model {model!r}: use {self.base_model!r} (or {BASE_ALIAS!r}), "
                "'<job_id>' for a job's latest version, or '<job_id>@<version>'."
            )
        return parsed[0], parsed[1] or LATEST

    async def prepare(
        self,
        model: str,
        prompts: list[list[int]],
        params: vllm.SamplingParams,
        kind: str,
        recording: Recording | None = None,
    ) -> Prepared:
        """Inside a trajectory, the trajectory's version answers whatever `model` says."""
        for prompt in prompts:
            self.sampler.check_prompt(prompt, params.max_tokens or 1)
        ref = recording.ref if recording else self.parse_model(model)
        target = await self.versions.resolve(*ref)
        return Prepared(
            model=model,
            target=target,
            prompts=prompts,
            params=params,
            id=f"{kind}-{uuid.uuid4().hex}",
            trajectory_id=recording.info.id if recording else None,
        )

    async def generate(self, prepared: Prepared) -> list[RequestOutput]:
        """Every prompt's output, all produced by the prepared version."""
        engine = self.sampler.engine
        async with self.versions.hold(prepared.target) as served:
            outputs = await asyncio.gather(
                *(
                    engine.generate(prompt, prepared.params, served.lora_request)
                    for prompt in prepared.prompts
                )
            )
        for output in outputs:
            for completion in output.outputs:
                check_weights(completion, prepared.target.weights)
        return list(outputs)

    async def stream(self, prepared: Prepared) -> AsyncIterator[tuple[int, CompletionOutput]]:
        """(prompt index, delta) as the engine produces them, prompts interleaved."""
        engine = self.sampler.engine
        queue: asyncio.Queue[tuple[int, CompletionOutput] | None] = asyncio.Queue()

        async def pump(index: int, prompt: list[int], lora: LoRARequest | None) -> None:
            try:
                async for output in engine.stream(prompt, prepared.params, lora):
                    for completion in output.outputs:
                        await queue.put((index, completion))
            finally:
                await queue.put(None)

        async with self.versions.hold(prepared.target) as served:
            tasks = [
                asyncio.create_task(pump(i, prompt, served.lora_request))
                for i, prompt in enumerate(prepared.prompts)
            ]
            try:
                running = len(tasks)
                while running:
                    item = await queue.get()
                    if item is None:
                        running -= 1
                        continue
                    if item[1].finished():
                        check_weights(item[1], prepared.target.weights)
                    yield item
                for task in tasks:
                    task.result()  # surface an engine error rather than a silent short stream
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    def models(self) -> ModelList:
        now = int(time.time())
        resident = self.versions.resident()
        cards = [ModelCard(id=self.base_model, created=now, loom={"job_id": None, "version": 0})]
        loaded = [resident.full] if resident.full and resident.full.job_id else []
        for version in loaded + resident.loras:
            cards.append(
                ModelCard(
                    id=f"{version.job_id}@{version.number}",
                    created=now,
                    root=self.base_model,
                    loom={
                        "job_id": version.job_id,
                        "version": version.number,
                        "kind": version.kind,
                    },
                )
            )
        return ModelList(data=cards)


def token_text(logprob: Logprob, token_id: int, sampler: Sampler) -> str:
    """A token as OpenAI shows it: its text (vLLM decodes the tokens it returns logprobs for)."""
    if logprob.decoded_token is not None:
        return logprob.decoded_token
    return sampler.engine.decode([token_id])


async def sse(chunks: AsyncIterator[LenientModel]) -> AsyncIterator[str]:
    """Server-sent events as OpenAI streams them: one `data:` per chunk, then `[DONE]`. An
    error after the response started can only be reported in the stream itself."""
    try:
        async for chunk in chunks:
            yield f"data: {chunk.model_dump_json()}\n\n"
    except LoomError as exc:
        error = ErrorEnvelope(
            error=ErrorBody(code=exc.code, message=exc.message, detail=exc.detail)
        )
        yield f"data: {error.model_dump_json()}\n\n"
    yield "data: [DONE]\n\n"
