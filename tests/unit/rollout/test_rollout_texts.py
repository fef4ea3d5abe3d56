"""Sample texts made once a sample is done (`span_texts`), as vLLM's detokenizer writes them;
tests/integration/rollout compares them with vLLM's own on a real engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer
from vllm.outputs import CompletionOutput

from services.common.tiny_model import build_tokenizer
from services.rollout.sampling import detokenizes_in_engine, span_texts, vllm_params
from services.rollout.schemas import SamplingParams


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    directory: Path = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(directory)
    return AutoTokenizer.from_pretrained(directory)


def completion(
    token_ids: list[int],
    finish_reason: str = "length",
    stop_reason: int | str | None = None,
    text: str = "",
) -> CompletionOutput:
    return CompletionOutput(
        index=0,
        text=text,
        token_ids=token_ids,
        cumulative_logprob=None,
        logprobs=None,
        finish_reason=finish_reason,
        stop_reason=stop_reason,
    )


def whole(tokenizer: Any, prompt: list[int], output: CompletionOutput) -> str:
    return span_texts(tokenizer, prompt, output, [(0, len(output.token_ids))])[0]


def test_spans_split_the_text_of_the_whole_sample(tokenizer: Any) -> None:
    prompt = tokenizer.encode("1+1=", add_special_tokens=False)
    ids = tokenizer.encode("12+34=46 hé", add_special_tokens=False)
    output = completion(ids)
    assert whole(tokenizer, prompt, output) == "12+34=46 hé"
    for cut in range(len(ids) + 1):
        parts = span_texts(tokenizer, prompt, output, [(0, cut), (cut, len(ids))])
        assert "".join(parts) == "12+34=46 hé", cut


def test_the_token_that_stopped_a_sample_has_no_text(tokenizer: Any) -> None:
    ids = tokenizer.encode("7*6=42", add_special_tokens=False)
    stop_token = ids[-1]  # "2" as a stop token id
    assert whole(tokenizer, [1], completion(ids, "stop", stop_token)) == "7*6=4"
    assert whole(tokenizer, [1], completion([*ids, 0], "stop", None)) == "7*6=42"  # EOS
    # A stop string ends the sample after its tokens: vLLM's own text is kept.
    assert whole(tokenizer, [1], completion(ids, "stop", "=", text="7*6")) == "7*6"


def test_an_incomplete_last_character_is_held_back(tokenizer: Any) -> None:
    ids = tokenizer.encode("ab€", add_special_tokens=False)  # € is three byte tokens
    assert tokenizer.decode(ids[:-1]) == "ab\ufffd"
    assert whole(tokenizer, [1], completion(ids[:-1])) == "ab"
    assert whole(tokenizer, [1], completion(ids)) == "ab€"


def test_vllm_detokenizes_only_for_stop_strings_and_python_only_tokenizers(tokenizer: Any) -> None:
    assert not detokenizes_in_engine(tokenizer)
    plain = SamplingParams(max_tokens=8)
    assert not vllm_params(plain, detokenize=False).detokenize
    assert vllm_params(plain.model_copy(update={"stop": ["\n"]}), detokenize=False).detokenize

    class PythonOnly:
        def decode(self, token_ids: list[int], skip_special_tokens: bool) -> str:
            return tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    assert detokenizes_in_engine(PythonOnly())
    ids = tokenizer.encode("9-3=6", add_special_tokens=False)
    assert span_texts(
        PythonOnly(), [1], completion(ids, "stop", ids[-1]), [(0, 2), (2, len(ids))]
    ) == ["9-", "3="]
