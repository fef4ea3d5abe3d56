"""Request validation of the rollout API and the OpenAI endpoints, without an engine."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from vllm.logprobs import FlatLogprobs, Logprob
from vllm.outputs import CompletionOutput

from services.common.errors import InvalidInput, LoomError, NotFound
from services.rollout.openai.schemas import ChatCompletionRequest, CompletionRequest
from services.rollout.openai.serving import OpenAIServing
from services.rollout.openai.tools import template_messages
from services.rollout.sampling import check_prompt, ranked, sampled_logprobs, vllm_params
from services.rollout.schemas import SampleRequest, SamplingParams


def test_prompt_ids_must_be_in_the_vocabulary() -> None:
    check_prompt([0, 270], 8, vocab_size=271, max_model_len=512)
    with pytest.raises(InvalidInput, match=r"\[0, 271\).*\[271, -1\]"):
        check_prompt([5, 271, -1], 8, vocab_size=271, max_model_len=512)


def test_prompt_and_max_tokens_must_fit_the_context() -> None:
    check_prompt([1] * 500, 12, vocab_size=271, max_model_len=512)
    with pytest.raises(InvalidInput, match=r"500 tokens\) \+ max_tokens \(13\) = 513.* 512"):
        check_prompt([1] * 500, 13, vocab_size=271, max_model_len=512)


def test_empty_prompt_is_refused() -> None:
    with pytest.raises(InvalidInput, match="empty"):
        check_prompt([], 8, vocab_size=271, max_model_len=512)


def test_sample_request_needs_exactly_one_prompt() -> None:
    SampleRequest(prompt="1+1=")
    for body in (
        {},
        {"prompt": "a", "prompt_token_ids": [1]},
        {"prompt_token_ids": []},
        {"prompt": "a", "n": 0},
        {"prompt": "a", "temperature": 1.0},
    ):
        with pytest.raises(ValidationError):
            SampleRequest.model_validate(body)


def test_vllm_params_ask_for_the_sampled_tokens_logprob() -> None:
    params = vllm_params(SamplingParams(max_tokens=5, temperature=0.5, seed=3), n=2)
    assert (params.logprobs, params.n, params.max_tokens, params.seed) == (0, 2, 5, 3)
    assert params.flat_logprobs


def _completion(token_ids: list[int], logprobs: Any) -> CompletionOutput:
    return CompletionOutput(
        index=0, text="", token_ids=token_ids, cumulative_logprob=None, logprobs=logprobs
    )


def test_sampled_logprobs_read_flat_and_nested_logprobs_alike() -> None:
    # Position 0 sampled token 7 (first), with the top-1 token 3 after it; position 1 token 5.
    nested = [{7: Logprob(-1.5, rank=2), 3: Logprob(-0.25, rank=1)}, {5: Logprob(-0.5, rank=1)}]
    flat = FlatLogprobs()
    flat.extend(nested)
    for entries in (nested, flat):
        assert sampled_logprobs(_completion([7, 5], entries)) == [-1.5, -0.5]


def test_a_prompts_first_token_is_unranked_in_flat_and_nested_logprobs() -> None:
    flat = FlatLogprobs()
    flat.extend([None, {4: Logprob(-0.75, rank=2), 9: Logprob(-0.5, rank=1)}])
    assert [ranked(entry, 1) for entry in flat] == [None, [(9, -0.5)]]
    assert ranked(None, 1) is None


def test_flat_logprobs_not_led_by_the_sampled_token_fail_loudly() -> None:
    flat = FlatLogprobs()
    flat.extend([{3: Logprob(-0.25, rank=1), 7: Logprob(-1.5, rank=2)}])
    with pytest.raises(LoomError, match="sampled tokens first"):
        sampled_logprobs(_completion([7], flat))


def test_openai_model_names() -> None:
    serving = OpenAIServing(
        sampler=None,
        versions=None,
        base_model="loom/tiny",  # type: ignore[arg-type]
        capture=None,
    )  # type: ignore[arg-type]
    assert serving.parse_model("loom/tiny") == (None, 0)
    assert serving.parse_model("base") == (None, 0)
    assert serving.parse_model("job-1") == ("job-1", "latest")
    assert serving.parse_model("job-1@7") == ("job-1", "7")
    assert serving.parse_model("job-1@best") == ("job-1", "best")
    for bad in ("gpt-4o/mini", "job@", "@3", "a b"):
        with pytest.raises(NotFound, match="Unknown model"):
            serving.parse_model(bad)


def test_openai_completion_prompts_single_or_batch() -> None:
    assert CompletionRequest(model="m", prompt="hi").prompts == ["hi"]
    assert CompletionRequest(model="m", prompt=[1, 2]).prompts == [[1, 2]]
    assert CompletionRequest(model="m", prompt=["a", "b"]).prompts == ["a", "b"]
    assert CompletionRequest(model="m", prompt=[[1], [2]]).prompts == [[1], [2]]
    for body in (
        {"model": "m", "prompt": []},
        {"model": "m", "prompt": "x", "logprobs": 21},
        {"model": "m", "prompt": "x", "max_tokens": 0},
        {"model": "m", "prompt": "x", "unknown": 1},
    ):
        with pytest.raises(ValidationError):
            CompletionRequest.model_validate(body)


def test_openai_chat_request_checks() -> None:
    ok = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}])
    assert template_messages(ok.messages) == [{"role": "user", "content": "hi"}]
    for body in (
        {"model": "m", "messages": []},
        {"model": "m", "messages": [{"role": "robot", "content": "x"}]},
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
    ):
        with pytest.raises(ValidationError):
            ChatCompletionRequest.model_validate(body)


def test_greedy_with_several_samples_is_a_clear_client_error() -> None:
    # vLLM raises its own (non-ValueError) validation error: it must become a 4xx, not a 500.
    with pytest.raises(InvalidInput, match="greedy"):
        vllm_params(SamplingParams(temperature=0.0), n=2)
