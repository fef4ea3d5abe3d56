"""Sampling with logprobs: Loom's own sampling API, and the checks and conversions the
OpenAI-compatible endpoints share."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from services.common.errors import InvalidInput, LoomError
from services.rollout.engine import RolloutEngine
from services.rollout.schemas import (
    RankedLogprobs,
    Sample,
    SampleBatchRequest,
    SampleBatchResponse,
    SampleOptions,
    SampleRequest,
    SampleResponse,
    SamplingParams,
    TokenizeRequest,
    TokenizeResponse,
)
from services.rollout.versions import Target, Versions

T = TypeVar("T")

if TYPE_CHECKING:
    import vllm
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput


def check_prompt(
    prompt_token_ids: list[int], max_tokens: int, *, vocab_size: int, max_model_len: int
) -> None:
    """Refuse what the engine would refuse, with the numbers a caller needs to fix it."""
    if not prompt_token_ids:
        raise InvalidInput("The prompt is empty: it must hold at least one token.")
    bad = [t for t in prompt_token_ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidInput(
            f"Prompt token ids must be in [0, {vocab_size}) for this model; got "
            f"{len(bad)} outside it, e.g. {bad[:5]}.",
            {"vocab_size": vocab_size},
        )
    total = len(prompt_token_ids) + max_tokens
    if total > max_model_len:
        raise InvalidInput(
            f"Prompt ({len(prompt_token_ids)} tokens) + max_tokens ({max_tokens}) = {total} "
            f"exceeds the model's context of {max_model_len} tokens.",
            {
                "prompt_tokens": len(prompt_token_ids),
                "max_tokens": max_tokens,
                "max_model_len": max_model_len,
            },
        )


def vllm_params(
    params: SamplingParams,
    *,
    n: int = 1,
    logprobs: int = 0,
    stream: bool = False,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    skip_special_tokens: bool = True,
    prompt_logprobs: int | None = None,
    detokenize: bool = True,
) -> vllm.SamplingParams:
    """Loom's sampling options as vLLM's; `logprobs=0` returns the sampled token's own (and
    `k` also the `k` most likely ones), `prompt_logprobs` the same for each prompt token
    (None: the prompt is not scored). `detokenize=False`: no text (`span_texts` makes it
    once the sample is done); stop strings need vLLM's text, so they keep it. Logprobs come
    flat (`FlatLogprobs`: a few lists per request, not a dict and an object per token, which
    vLLM's output handler builds at every step of every request)."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.exceptions import VLLMClientError
    from vllm.sampling_params import RequestOutputKind

    try:
        return VllmSamplingParams(
            n=n,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            stop=params.stop or None,
            seed=params.seed,
            stop_token_ids=params.stop_token_ids or None,
            logprobs=logprobs,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
            skip_special_tokens=skip_special_tokens,
            prompt_logprobs=prompt_logprobs,
            detokenize=detokenize or bool(params.stop),
            flat_logprobs=True,
            output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
        )
    except (ValueError, VLLMClientError) as exc:  # vLLM's checks on combinations of options
        raise InvalidInput(f"Invalid sampling parameters: {exc}") from exc


def span_texts(
    tokenizer: Any,
    prompt_ids: list[int],
    completion: CompletionOutput,
    spans: list[tuple[int, int]],
) -> list[str]:
    """The text of each span [start, end) of the completion's tokens (contiguous, in order),
    as vLLM's detokenizer writes it: the same `tokenizers` `DecodeStream`, primed with the
    prompt and fed token by token, special tokens skipped, no text for the token that stopped
    the generation (EOS or a stop token id), an incomplete last character held back. vLLM's
    own text where it made one (stop strings need it, and tokenizers without a Rust backend).
    Decoding once per sample costs far less than vLLM's detokenizing, which also decodes each
    sampled token again for its logprob entry: half the rollout process's CPU, profiled."""
    if completion.text and len(spans) == 1:
        return [completion.text]
    token_ids = list(completion.token_ids)
    stopped_by_token = completion.finish_reason == "stop" and not isinstance(
        completion.stop_reason, str
    )
    with_text = len(token_ids) - 1 if stopped_by_token else len(token_ids)
    backend = _rust_backend(tokenizer)
    if backend is None:
        return [
            str(tokenizer.decode(token_ids[a : min(b, with_text)], skip_special_tokens=True))
            for a, b in spans
        ]
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(ids=prompt_ids, skip_special_tokens=True)
    texts = []
    for start, end in spans:
        chunks = [stream.step(backend, token) for token in token_ids[start : min(end, with_text)]]
        texts.append("".join(chunk for chunk in chunks if chunk))
    return texts


def detokenizes_in_engine(tokenizer: Any) -> bool:
    """Whether samples need vLLM's detokenizer (no Rust backend for `span_texts`)."""
    return _rust_backend(tokenizer) is None


def _rust_backend(tokenizer: Any) -> Any:
    """The `tokenizers.Tokenizer` behind a fast Hugging Face tokenizer (None: Python-only)."""
    return getattr(tokenizer, "_tokenizer", None)


def sampled_logprobs(completion: CompletionOutput) -> list[float]:
    """The logprob of each sampled token: vLLM puts it first at each position (at
    logprobs=0 it is the only one)."""
    from vllm.logprobs import FlatLogprobs

    entries = completion.logprobs or []
    if isinstance(entries, FlatLogprobs):
        firsts = entries.start_indices
        if [entries.token_ids[i] for i in firsts] != list(completion.token_ids):
            raise LoomError("vLLM's logprobs do not list the sampled tokens first.")
        return [entries.logprobs[i] for i in firsts]
    return [
        entry[token].logprob for token, entry in zip(completion.token_ids, entries, strict=True)
    ]


def scored_prompt(prompt_ids: list[int], output: vllm.RequestOutput) -> list[float | None]:
    """Each prompt token's logprob given the ones before it; None for the first."""
    entries = output.prompt_logprobs or []
    return [None] + [
        entry[token].logprob if entry else None
        for token, entry in zip(prompt_ids[1:], entries[1:], strict=True)
    ]


def top_entries(entry: dict[int, Logprob], k: int) -> list[tuple[int, Logprob]]:
    """The `k` most likely tokens at one position, most likely first."""
    ranked = [(t, lp) for t, lp in entry.items() if lp.rank is not None and lp.rank <= k]
    return sorted(ranked, key=lambda item: item[1].rank or 0)


def ranked(entry: dict[int, Logprob] | None, k: int) -> RankedLogprobs | None:
    """(token id, logprob) of the `k` most likely tokens at a position; None where vLLM
    scored nothing (a prompt's first token: None, or an empty entry in flat logprobs)."""
    return None if not entry else [(t, lp.logprob) for t, lp in top_entries(entry, k)]


def stop_reason(completion: CompletionOutput) -> Literal["stop", "length", "abort"]:
    reason = completion.finish_reason
    return reason if reason in ("stop", "length") else "abort"  # type: ignore[return-value]


def check_weights(completion: CompletionOutput, expected: str) -> None:
    """vLLM tags tokens with the weights that produced them: a sample reports the version it
    was truly sampled with, or fails loudly (that would be a bug in the weights gate)."""
    labels = {span.version for span in completion.weight_versions or []}
    if labels - {expected}:
        raise LoomError(f"Sample produced by weights {sorted(labels)}, expected {expected!r}.")


async def all_or_none(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Every call's result, in order; when one fails, the others are cancelled (their engine
    requests aborted) before its error is raised as it is."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class Sampler:
    def __init__(self, engine: RolloutEngine, versions: Versions) -> None:
        self.engine = engine
        self.versions = versions

    def prompt_ids(self, prompt: str | None, prompt_token_ids: list[int] | None) -> list[int]:
        return (
            prompt_token_ids if prompt_token_ids is not None else self.engine.encode(prompt or "")
        )

    def check_prompt(self, prompt_token_ids: list[int], max_tokens: int) -> None:
        check_prompt(
            prompt_token_ids,
            max_tokens,
            vocab_size=self.engine.vocab_size,
            max_model_len=self.engine.max_model_len,
        )

    async def sample(self, request: SampleRequest) -> SampleResponse:
        prompt_ids = self.prompt_ids(request.prompt, request.prompt_token_ids)
        self.check_prompt(prompt_ids, request.params.max_tokens)
        (response,) = await self._sample_all(request, [prompt_ids], [request.params])
        return response

    async def sample_batch(self, request: SampleBatchRequest) -> SampleBatchResponse:
        """Every prompt on one version, handed to the engine together (one engine batch,
        where a request per prompt reaches it in waves); prompt i seeded `params.derived(i)`."""
        prompts = []
        for index, prompt in enumerate(request.prompts):
            ids = self.prompt_ids(prompt, None) if isinstance(prompt, str) else prompt
            try:
                self.check_prompt(ids, request.params.max_tokens)
            except InvalidInput as exc:
                raise InvalidInput(f"Prompt {index}: {exc.message}", exc.detail) from exc
            prompts.append(ids)
        params = [request.params.derived(i) for i in range(len(prompts))]
        responses = await self._sample_all(request, prompts, params)
        return SampleBatchResponse(
            job_id=request.job_id, version=responses[0].version, responses=responses
        )

    async def _sample_all(
        self,
        request: SampleOptions,
        prompts: list[list[int]],
        params: list[SamplingParams],
    ) -> list[SampleResponse]:
        """Each prompt sampled with its options, all on the version `request` names (an alias
        resolved once), the engine given them all at once."""
        scored = request.prompt_logprobs or request.prompt_top_logprobs > 0
        detokenize = detokenizes_in_engine(self.engine.tokenizer)
        engine_params = [
            vllm_params(
                options,
                n=request.n,
                logprobs=request.top_logprobs,
                prompt_logprobs=request.prompt_top_logprobs if scored else None,
                detokenize=detokenize,
            )
            for options in params
        ]
        async with self.versions.use(request.job_id, request.version) as served:
            outputs = await all_or_none(
                self.engine.generate(ids, options, served.lora_request)
                for ids, options in zip(prompts, engine_params, strict=True)
            )
        return [
            self._response(request, served.target, ids, output, scored)
            for ids, output in zip(prompts, outputs, strict=True)
        ]

    def _response(
        self,
        request: SampleOptions,
        target: Target,
        prompt_ids: list[int],
        output: vllm.RequestOutput,
        scored: bool,
    ) -> SampleResponse:
        samples = []
        for completion in sorted(output.outputs, key=lambda c: c.index):
            check_weights(completion, target.weights)
            samples.append(
                Sample(
                    token_ids=list(completion.token_ids),
                    logprobs=sampled_logprobs(completion),
                    text=span_texts(
                        self.engine.tokenizer,
                        prompt_ids,
                        completion,
                        [(0, len(completion.token_ids))],
                    )[0],
                    stop_reason=stop_reason(completion),
                    version=target.number,
                    top_logprobs=[
                        ranked(entry, request.top_logprobs) for entry in completion.logprobs or []
                    ]
                    if request.top_logprobs
                    else None,
                )
            )
        return SampleResponse(
            job_id=request.job_id,
            version=target.number,
            prompt_token_ids=prompt_ids,
            samples=samples,
            prompt_logprobs=scored_prompt(prompt_ids, output) if scored else None,
            prompt_top_logprobs=[
                ranked(entry, request.prompt_top_logprobs) for entry in output.prompt_logprobs or []
            ]
            if request.prompt_top_logprobs
            else None,
        )

    async def sample_until_newer(self, request: SampleRequest) -> tuple[list[Sample], int | None]:
        """One sample (n=1) for a partial rollout, in parts by the version that sampled them,
        and the newer version that interrupted it, if one did. On full weights a generation
        goes on across swaps to newer versions of its job (the engine carries it over); on an
        adapter it stops, keeping what it has, once a newer version is announced, to be
        continued on it."""
        assert request.prompt_token_ids is not None and request.job_id is not None
        self.check_prompt(request.prompt_token_ids, request.params.max_tokens)
        # Not streamed: an interruption aborts the request, and vLLM's final (aborted)
        # output still holds every token and logprob, without a wake-up per token meanwhile.
        params = vllm_params(
            request.params, detokenize=detokenizes_in_engine(self.engine.tokenizer)
        )
        newest = self.versions.newest(request.job_id)
        if isinstance(request.version, int) and request.version < newest:
            # Already outdated: holding it could even swap old full weights back in.
            return [
                Sample(
                    token_ids=[], logprobs=[], text="", stop_reason="abort", version=request.version
                )
            ], newest
        async with self.versions.use(request.job_id, request.version, movable=True) as served:
            version = served.target.number
            newer = (
                None
                if served.target.kind == "full"
                else asyncio.ensure_future(self.versions.newer_than(request.job_id, version))
            )
            try:
                output = await self.engine.generate(
                    request.prompt_token_ids,
                    params,
                    served.lora_request,
                    interrupt=newer,
                    movable=served.target.kind == "full",
                )
            finally:
                if newer is not None:
                    newer.cancel()
        (completion,) = output.outputs
        reason = stop_reason(completion)
        interrupted_by = (
            newer.result()
            if newer is not None and reason == "abort" and newer.done() and not newer.cancelled()
            else None
        )
        token_ids, logprobs = list(completion.token_ids), sampled_logprobs(completion)
        spans = self._version_spans(completion, served.target)
        texts = span_texts(
            self.engine.tokenizer,
            request.prompt_token_ids,
            completion,
            [(start, end) for _, start, end in spans],
        )
        return [
            Sample(
                token_ids=token_ids[start:end],
                logprobs=logprobs[start:end],
                text=text,
                stop_reason=reason if end == len(token_ids) else "abort",
                version=number,
            )
            for (number, start, end), text in zip(spans, texts, strict=True)
        ], interrupted_by

    def _version_spans(
        self, completion: CompletionOutput, target: Target
    ) -> list[tuple[int, int, int]]:
        """(version, start, end) of each run of tokens one version sampled. Weights other
        than `target`'s must be later versions of its job, swapped in under a generation that
        was allowed to move."""
        runs = []
        for span in completion.weight_versions or []:
            if span.version == target.weights:
                runs.append((target.number, span.start, span.end))
            elif self.versions.succeeds(span.version, target.weights):
                moved_to = self.versions.full_target(span.version)
                assert moved_to is not None  # a successor is a known full version
                runs.append((moved_to.number, span.start, span.end))
            else:
                raise LoomError(
                    f"Sample produced by weights {span.version!r}, expected "
                    f"{target.weights!r} or a later version of it."
                )
        return runs or [(target.number, 0, len(completion.token_ids))]

    def tokenize(self, request: TokenizeRequest) -> TokenizeResponse:
        return TokenizeResponse(
            token_ids=[
                self.engine.encode(text, request.add_special_tokens) for text in request.texts
            ]
        )
