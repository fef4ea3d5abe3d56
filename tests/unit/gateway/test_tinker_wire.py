"""The Tinker protocol's pure parts: protobuf round trips, datum conversion, futures."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from gateway.compat.common.calls import CLIENT_LOSS
from gateway.compat.common.futures import Futures
from gateway.compat.tinker import wire
from gateway.compat.tinker.convert import TinkerDatum, loom_batch, sampling_params, tinker_datum
from gateway.compat.tinker.futures import PENDING, retrieve
from gateway.compat.tinker.schemas import TinkerSamplingParams
from services.common.errors import InvalidInput, NotFound
from services.rollout.schemas import Sample


def request(tokens: list[int], targets: list[int], **floats: list[float]) -> bytes:
    message = wire.ForwardBackwardRequest(model_id="s:train:0", seq_id=1, loss_fn="cross_entropy")
    datum = message.data.add()
    datum.model_input.add().encoded_text.tokens = np.asarray(tokens, "<i4").tobytes()
    tensor = datum.loss_fn_inputs["target_tokens"]
    tensor.dense, tensor.dtype = np.asarray(targets, "<i8").tobytes(), wire.INT64
    for name, values in floats.items():
        tensor = datum.loss_fn_inputs[name]
        tensor.dense, tensor.dtype = np.asarray(values, "<f4").tobytes(), wire.FLOAT32
    return bytes(message.SerializeToString())


def parsed(body: bytes) -> TinkerDatum:
    message = wire.ForwardBackwardRequest()
    message.ParseFromString(body)
    return tinker_datum(message.data[0], 0)


def test_a_shifted_datum_becomes_one_loom_sequence_with_weights_as_the_mask() -> None:
    datum = parsed(request([5, 6, 7], [6, 7, 8], weights=[0.0, 1.0, 0.5]))
    (converted,), loss = loom_batch([datum], "cross_entropy", {})
    assert converted.input_ids == [5, 6, 7, 8]
    assert converted.loss_mask == [0.0, 0.0, 1.0, 0.5]
    assert loss.name == "cross_entropy" and loss.aggregation == "sum"


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo", "cispo", "dro"])
def test_policy_losses_carry_sampler_logprobs_and_advantages(loss_fn: str) -> None:
    datum = parsed(request([5, 6], [6, 7], logprobs=[0.0, -0.5], advantages=[0.0, 2.0]))
    (converted,), loss = loom_batch([datum], loss_fn, {})
    assert loss.name == loss_fn
    assert converted.logprobs == [0.0, 0.0, -0.5] and converted.advantages == [0.0, 0.0, 2.0]
    with pytest.raises(InvalidInput, match="needs loss_fn_inputs\\['logprobs'\\]"):
        loom_batch([parsed(request([5, 6], [6, 7], advantages=[0, 1]))], loss_fn, {})


def test_negative_cross_entropy_weights_are_a_client_side_custom_loss() -> None:
    # forward_backward_custom sends weights = -dL/dlogprob on a cross_entropy call
    datum = parsed(request([5, 6, 7], [6, 7, 8], weights=[0.0, -1.5, 2.0]))
    (converted,), loss = loom_batch([datum], "cross_entropy", {})
    assert loss is CLIENT_LOSS
    assert converted.loss_mask == [0.0, 1.0, 1.0, 1.0]
    # -sum(A * logprob) with A = weights: the cross-entropy's value and gradient
    assert converted.advantages == [0.0, 0.0, -1.5, 2.0]


@pytest.mark.parametrize("targets", [[9, 9, 9], [6, 7]])
def test_targets_that_are_not_the_shifted_input_are_refused(targets: list[int]) -> None:
    with pytest.raises(InvalidInput, match="target_tokens"):
        loom_batch([parsed(request([5, 6, 7], targets))], "cross_entropy", {})


def test_padded_targets_with_no_loss_are_taken_and_others_are_named() -> None:
    """The cookbook pads prompt positions with target 0 and weight (or advantage) 0."""
    padded = parsed(request([5, 6, 7, 8], [0, 0, 8, 9], weights=[0.0, 0.0, 1.0, 1.0]))
    (converted,), _ = loom_batch([padded], "cross_entropy", {})
    assert converted.input_ids == [5, 6, 7, 8, 9]
    assert converted.loss_mask == [0.0, 0.0, 0.0, 1.0, 1.0]
    policy = parsed(
        request([5, 6, 7], [0, 7, 8], logprobs=[0.0, -0.5, -0.5], advantages=[0.0, 1.0, 1.0])
    )
    (converted,), _ = loom_batch([policy], "importance_sampling", {})
    assert converted.loss_mask == [0.0, 0.0, 1.0, 1.0]
    carrying = parsed(request([5, 6, 7, 8], [0, 0, 8, 9], weights=[0.0, 1.0, 1.0, 1.0]))
    with pytest.raises(
        InvalidInput,
        match=r"target_tokens\[1\] is 0, not the next input "
        r"token 7",
    ) as refused:
        loom_batch([carrying], "cross_entropy", {})
    assert refused.value.detail == {"index": 0, "position": 1}


def test_outputs_round_trip_as_the_sdk_decodes_them() -> None:
    out = wire.ForwardBackwardOutput()
    out.ParseFromString(wire.forward_backward_output([[-1.0, -2.0], [-3.0]], {"loss:sum": 6.0}))
    field = out.loss_fn_outputs[0].fields["logprobs"]
    offsets = np.frombuffer(field.offsets, "<i8")
    values = np.frombuffer(field.data, "<f4")
    assert list(offsets) == [0, 8, 12] and list(values) == [-1.0, -2.0, -3.0]
    assert out.metrics["loss:sum"] == 6.0
    sample = wire.SampleResponse()
    sample.ParseFromString(
        wire.sample_response(
            [
                Sample(
                    token_ids=[4, 5],
                    logprobs=[-0.5, -0.25],
                    text="",
                    stop_reason="length",
                    version=1,
                )
            ]
        )
    )
    assert list(np.frombuffer(sample.sequences[0].tokens, "<i4")) == [4, 5]
    assert sample.sequences[0].stop_reason == wire.STOP_REASON_LENGTH
    assert not sample.sequences[0].HasField("topk_sampled_logprobs")
    assert not sample.HasField("topk_prompt_logprobs")


def test_top_k_logprobs_are_dense_matrices_with_empty_cells_marked() -> None:
    sampled = Sample(
        token_ids=[4, 5],
        logprobs=[-0.5, -0.25],
        text="",
        stop_reason="stop",
        version=1,
        top_logprobs=[[(4, -0.5), (9, -1.0)], [(5, -0.25), (4, -2.0)]],
    )
    out = wire.SampleResponse()
    out.ParseFromString(
        wire.sample_response(
            [sampled], [None, -1.5], [None, [(3, -0.1), (7, -1.5)]], top_k=2, prompt_top_k=2
        )
    )
    prompt = out.topk_prompt_logprobs
    assert (prompt.k, prompt.length) == (2, 2)
    ids = np.frombuffer(prompt.token_ids, "<i4").reshape(2, 2)
    lps = np.frombuffer(prompt.logprobs, "<f4").reshape(2, 2)
    assert ids.tolist() == [[0, 0], [3, 7]]
    assert lps[0].tolist() == [wire.EMPTY_TOP_LOGPROB] * 2
    assert lps[1].tolist() == pytest.approx([-0.1, -1.5])
    top = out.sequences[0].topk_sampled_logprobs
    assert np.frombuffer(top.token_ids, "<i4").tolist() == [4, 9, 5, 4]
    assert np.isnan(np.frombuffer(out.prompt_logprobs, "<f4")[0])


def test_stop_strings_and_stop_tokens_are_told_apart() -> None:
    assert sampling_params(TinkerSamplingParams(stop="\n")).stop == ["\n"]
    params = sampling_params(TinkerSamplingParams(stop=[7, 8], max_tokens=5))
    assert (params.stop, params.stop_token_ids, params.max_tokens) == ([], [7, 8], 5)


async def test_futures_wait_then_answer_and_failures_take_the_sdk_shape(
    gateway_db: sessionmaker[Session],
) -> None:
    futures = Futures(gateway_db, "req")
    gate = asyncio.Event()

    async def work() -> bytes:
        await gate.wait()
        return b"done"

    async def broken() -> bytes:
        raise InvalidInput("bad datum")

    slow, failing = await futures.submit(work()), await futures.submit(broken())
    assert await retrieve(futures, slow, 0.01) is PENDING
    gate.set()
    assert await retrieve(futures, slow, 1) == b"done"
    assert await retrieve(futures, failing, 1) == {"error": "bad datum", "category": "user"}
    with pytest.raises(NotFound):
        await retrieve(futures, "req-unknown", 0)
