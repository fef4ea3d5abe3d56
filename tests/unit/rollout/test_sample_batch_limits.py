"""A batch sampling request asks the service for no more than one request may: prompts x n x
max_tokens within MAX_BATCH_SAMPLE_TOKENS, refused with a message saying how many prompts fit."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.rollout.schemas import (
    MAX_BATCH_PROMPTS,
    MAX_BATCH_SAMPLE_TOKENS,
    SampleBatchRequest,
    batch_prompts_limit,
)


def test_a_batch_over_the_token_budget_is_refused_naming_what_fits() -> None:
    params = {"max_tokens": 32768}
    SampleBatchRequest.model_validate({"prompts": ["a"] * 16, "n": 16, "params": params})
    with pytest.raises(ValidationError, match="send at most 16 prompts per request"):
        SampleBatchRequest.model_validate({"prompts": ["a"] * 17, "n": 16, "params": params})


@pytest.mark.parametrize(
    ("n", "max_tokens", "most"),
    [(1, 64, MAX_BATCH_PROMPTS), (8, 1024, MAX_BATCH_PROMPTS), (16, 32768, 16), (256, 32768, 1)],
)
def test_the_limit_is_the_budget_over_tokens_per_prompt(n: int, max_tokens: int, most: int) -> None:
    assert batch_prompts_limit(n, max_tokens) == most
    assert most == 1 or most * n * max_tokens <= MAX_BATCH_SAMPLE_TOKENS
