"""The Weaver protocol's pure parts: datum conversion, loss configs, outputs, paths,
operation envelopes and the per-model call order."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gateway.compat.common.calls import CLIENT_LOSS, CallOrder
from gateway.compat.common.futures import Futures
from gateway.compat.weaver import convert, operations, paths, schemas
from services.common.errors import InvalidInput, NotFound, Unavailable
from services.trainer.schemas import LossName


def datum(tokens: list[int], **inputs: Any) -> schemas.Datum:
    return schemas.Datum.model_validate(
        {
            "model_input": {"chunks": [{"type": "encoded_text", "tokens": tokens}]},
            "loss_fn_inputs": inputs,
        }
    )


def batch(loss_fn: str, *data: schemas.Datum, **config: float) -> convert.TrainingBatch:
    return convert.training_batch(
        schemas.PassInput(loss_fn=loss_fn, data=list(data), loss_fn_config=config or None)
    )


def test_targets_shift_into_one_loom_sequence_and_ignored_ones_carry_no_loss() -> None:
    # input [5, 6, 7], targets [6, 7, 8]: Loom's sequence is [5, 6, 7, 8]
    tensor = {"data": [6, 7, 8], "dtype": "int64"}
    (loom,) = batch(
        "cross_entropy", datum([5, 6, 7], target_tokens=tensor, weights=[0.5, 1.0, 2.0])
    ).data
    assert loom.input_ids == [5, 6, 7, 8] and loom.loss_mask == [0.0, 0.5, 1.0, 2.0]
    # -100 on the prompt; the last target ignored too, so nothing is appended
    (loom,) = batch("cross_entropy", datum([5, 6, 7, 8], target_tokens=[-100, 7, 8, -100])).data
    assert loom.input_ids == [5, 6, 7, 8] and loom.loss_mask == [0.0, 0.0, 1.0, 1.0]


def test_policy_losses_carry_the_samplers_logprobs_and_advantages_shifted() -> None:
    (loom,) = batch(
        "importance_sampling",
        datum(
            [5, 6, 7],
            target_tokens=[6, 7, 8],
            logprobs=[0.0, -1.0, -2.0],
            advantages=[0.0, 1.0, 1.0],
            loss_mask=[0, 1, 1],
        ),
    ).data
    assert loom.logprobs == [0.0, 0.0, -1.0, -2.0] and loom.advantages == [0.0, 0.0, 1.0, 1.0]
    assert loom.loss_mask == [0.0, 0.0, 1.0, 1.0]
    ppo = batch(
        "ppo",
        datum([5, 6], target_tokens=[6, 7], logprobs=[0, 0], advantages=[1, 1]),
        clip_low_threshold=0.9,
        clip_high_threshold=1.1,
    ).loss
    assert ppo is not None and ppo.name == LossName.ppo
    assert (ppo.clip_low, ppo.clip_high) == pytest.approx((0.1, 0.1))
    assert batch("forward_logprob", datum([5, 6], target_tokens=[6, 7])).loss is None


@pytest.mark.parametrize(
    ("loss_fn", "inputs", "words"),
    [
        ("dpo", {"target_tokens": [6, 7]}, "'dpo' is not served"),
        ("dro", {"target_tokens": [6, 7], "logprobs": [0, 0]}, "'advantages'"),
        ("surrogate", {"target_tokens": [6, 7]}, "'surrogate_weights'"),
        ("cross_entropy", {}, "target_tokens"),
        ("cross_entropy", {"target_tokens": [9, 7]}, "shifted by one"),
        ("cross_entropy", {"target_tokens": [6]}, "flat list of 2"),
        ("cross_entropy", {"target_tokens": [6, 7], "weights": [[1], [1]]}, "flat list"),
        ("cross_entropy", {"target_tokens": [6, 7], "weights": [1, -1]}, "negative"),
        ("importance_sampling", {"target_tokens": [6, 7], "advantages": [1, 1]}, "'logprobs'"),
    ],
)
def test_bad_data_names_what_to_fix(loss_fn: str, inputs: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidInput, match=words):
        batch(loss_fn, datum([5, 6], **inputs))
    with pytest.raises(InvalidInput, match="at least one target"):
        batch("cross_entropy", datum([5], target_tokens=[-100]))


def test_config_keys_a_loss_does_not_take_are_refused() -> None:
    with pytest.raises(InvalidInput, match="clip_low_threshold"):
        batch("cross_entropy", datum([5, 6], target_tokens=[6, 7]), clip_low_threshold=0.8)
    with pytest.raises(InvalidInput, match=r"out of range for 'ppo'.*\[1, 11\]"):
        batch(
            "ppo",
            datum([5, 6], target_tokens=[6, 7], logprobs=[0, 0], advantages=[1, 1]),
            clip_high_threshold=0.5,
        )


def test_cispo_and_dro_take_their_config_and_the_sdks_defaults() -> None:
    policy = {"target_tokens": [6, 7], "logprobs": [0, 0], "advantages": [1, 1]}
    cispo = batch("cispo", datum([5, 6], **policy)).loss
    assert cispo is not None and cispo.name == LossName.cispo
    assert cispo.clips == pytest.approx((1.0, 3.0))  # ratio in [0, 4]
    dro = batch("dro", datum([5, 6], **policy), beta=0.2).loss
    assert dro is not None and (dro.name, dro.dro_beta) == (LossName.dro, 0.2)
    with pytest.raises(InvalidInput, match="it reads \\['beta'\\]"):
        batch("dro", datum([5, 6], **policy), clip_low_threshold=0.5)


def test_surrogate_sends_the_client_losss_gradient_as_negated_advantages() -> None:
    # forward_backward_custom's second call: surrogate_weights = dL/dlogprob per target
    data = batch(
        "surrogate",
        datum(
            [5, 6, 7],
            target_tokens=[-100, 7, 8],
            surrogate_weights=[9.0, 0.5, -2.0],
            weights=[0, 1, 1],
        ),
    )
    (loom,) = data.data
    assert data.loss is CLIENT_LOSS
    assert loom.input_ids == [5, 6, 7, 8]
    assert loom.loss_mask == [0.0, 0.0, 1.0, 1.0]  # -100 has no target; weights are in L
    assert loom.advantages == [0.0, -9.0, -0.5, 2.0]


def test_outputs_give_one_logprob_per_target_and_the_loss_sum() -> None:
    data = batch(
        "cross_entropy",
        datum([5, 6, 7], target_tokens=[-100, 7, 8]),
        datum([5, 6], target_tokens=[6, -100]),
    )
    rows = [[0.0, -0.1, -0.2, -0.3], [0.0, -0.5]]
    out = convert.outputs(data, rows, 1.0)
    first, second = (o["logprobs"]["data"] for o in out["loss_fn_outputs"])
    assert first == [0.0, -0.2, -0.3] and second == [-0.5, 0.0]
    assert out["metrics"] == {"loss:sum": 1.0}


def test_paths_name_their_model_and_unnamed_exports_their_version() -> None:
    path = paths.parse("weaver://job-1/sampler_weights/v7", paths.SAMPLER_WEIGHTS)
    assert (path.model_id, path.version, str(path)) == (
        "job-1",
        7,
        "weaver://job-1/sampler_weights/v7",
    )
    assert paths.parse("weaver://job-1/sampler_weights/best", paths.SAMPLER_WEIGHTS).version is None
    for bad in (
        "weaver://job-1/checkpoints/x",
        "tinker://job-1/sampler_weights/v1",
        "weaver://job-1/sampler_weights/",
    ):
        with pytest.raises(InvalidInput, match="save_weights_for_sampler"):
            paths.parse(bad, paths.SAMPLER_WEIGHTS)


async def test_operations_are_pending_then_done_or_failed_in_the_sdks_shape(
    gateway_db: sessionmaker[Session],
) -> None:
    futures = Futures(gateway_db, "op")
    gate = asyncio.Event()

    async def work() -> dict[str, Any]:
        await gate.wait()
        return {"ok": True}

    async def down() -> dict[str, Any]:
        raise Unavailable("trainer unreachable")

    async def wrong() -> dict[str, Any]:
        raise InvalidInput("bad datum")

    slow = await futures.submit(work())
    pending = await operations.submitted(futures, slow)
    assert pending.model_dump(exclude_unset=True) == {
        "id": slow,
        "status": "pending",
        "response": None,
    }
    gate.set()
    done = await operations.poll(futures, slow, 1)
    assert done.model_dump(exclude_unset=True) == {
        "id": slow,
        "status": "done",
        "response": {"ok": True},
    }
    failed = await operations.poll(futures, await futures.submit(down()), 1)
    assert failed.status == "error" and failed.retryable is True
    assert failed.error_code == "unavailable"
    failed = await operations.poll(futures, await futures.submit(wrong()), 1)
    assert (failed.error_message, failed.retryable) == ("bad datum", False)
    with pytest.raises(NotFound):
        await operations.poll(futures, "op-unknown", 0)


async def test_call_order_runs_calls_by_seq_id_and_a_resent_one_once(
    gateway_db: sessionmaker[Session],
) -> None:
    futures, order, submitted = Futures(gateway_db, "op"), CallOrder("m"), []

    async def place(seq_id: int) -> str:
        async def submit() -> int:
            submitted.append(seq_id)
            return seq_id

        async def result(n: int) -> dict[str, Any]:
            return {"n": n}

        return await order.place(futures, seq_id, submit, result)

    second = asyncio.ensure_future(place(2))
    await asyncio.sleep(0.01)
    assert submitted == []  # 2 waits for 1
    first = await place(1)
    assert await second != first and submitted == [1, 2]
    assert await place(2) == await second and submitted == [1, 2]  # resent: the same call
    # A model found again after a restart: the SDK's next number starts the order.
    found, submitted[:] = CallOrder("m2", next_seq=0), []
    order = found
    await place(41)
    await place(42)
    assert submitted == [41, 42]
