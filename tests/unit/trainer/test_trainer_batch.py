"""Padding, masks, per-token logprob gathering and input validation."""

from __future__ import annotations

import math

import pytest
import torch

from services.common.errors import InvalidInput
from services.trainer.batch import collate, token_logprobs, unpad, validate_data
from services.trainer.schemas import Datum

CPU = torch.device("cpu")


def test_collate_pads_right_and_masks_position_zero() -> None:
    data = [
        Datum(input_ids=[5, 6, 7], loss_mask=[1, 1, 1]),
        Datum(input_ids=[1, 2, 3, 4, 5], loss_mask=[0, 0, 1, 1, 1]),
    ]
    batch = collate(data, CPU)
    assert batch.input_ids.tolist() == [[5, 6, 7, 0, 0], [1, 2, 3, 4, 5]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch.loss_mask.tolist() == [[0, 1, 1, 0, 0], [0, 0, 1, 1, 1]]
    assert batch.num_tokens == 5
    assert batch.old_logprobs is None and batch.advantages is None
    assert batch.lengths == [3, 5]


def test_collate_keeps_policy_fields_when_every_datum_has_them() -> None:
    data = [
        Datum(input_ids=[1, 2], loss_mask=[0, 1], advantages=[0, 2], logprobs=[0, -1]),
        Datum(input_ids=[1, 2, 3], loss_mask=[0, 1, 1], advantages=[0, 1, 1], logprobs=[0, -2, -3]),
    ]
    batch = collate(data, CPU)
    assert batch.advantages is not None and batch.old_logprobs is not None
    assert batch.advantages.tolist() == [[0, 2, 0], [0, 1, 1]]
    assert batch.old_logprobs.tolist() == [[0, -1, 0], [0, -2, -3]]


def test_token_logprobs_gathers_the_next_token() -> None:
    # Vocabulary of 2. Logits [0, 0] give p = 1/2 each; [ln 3, 0] give p = 3/4, 1/4.
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0], [9.0, 9.0]]])
    input_ids = torch.tensor([[1, 0, 1]])
    logprobs = token_logprobs(logits, input_ids)
    # position 1 predicts token 0 from logits[0]; position 2 predicts token 1 from logits[1]
    assert logprobs[0].tolist() == pytest.approx([0.0, math.log(0.5), math.log(0.25)])
    assert unpad(logprobs, [2]) == [pytest.approx([0.0, math.log(0.5)])]


def test_validate_rejects_token_ids_outside_the_vocabulary() -> None:
    data = [Datum(input_ids=[1, 2], loss_mask=[0, 1]), Datum(input_ids=[1, 271], loss_mask=[0, 1])]
    with pytest.raises(InvalidInput, match=r"data\[1\]: token id 271 .*\(size 271"):
        validate_data(data, vocab_size=271, max_length=512, needs_loss=True)


def test_validate_rejects_sequences_longer_than_the_model() -> None:
    with pytest.raises(InvalidInput, match="exceed the model's maximum length of 4"):
        validate_data([Datum(input_ids=[1] * 5, loss_mask=[1] * 5)], 271, 4, needs_loss=True)


def test_validate_rejects_negative_weights_and_lossless_batches() -> None:
    with pytest.raises(InvalidInput, match="non-negative"):
        validate_data([Datum(input_ids=[1, 2], loss_mask=[0, -1])], 271, 512, needs_loss=True)
    lossless = [Datum(input_ids=[1, 2], loss_mask=[1, 0])]
    with pytest.raises(InvalidInput, match="No token carries loss"):
        validate_data(lossless, 271, 512, needs_loss=True)
    validate_data(lossless, 271, 512, needs_loss=False)  # forward needs no loss
