"""Tinker's training data and sampling parameters as Loom's trainer and rollout take them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.compat.common.calls import (
    CLIENT_LOSS,
    builtin_loss,
    check_shifted_targets,
    client_loss_datum,
)
from gateway.compat.tinker import schemas, wire
from services.common.errors import InvalidInput
from services.rollout.schemas import SamplingParams
from services.trainer.schemas import LOSS_INPUTS, Datum, LossConfig, LossName

DEFAULT_MAX_TOKENS = 64


@dataclass(frozen=True)
class TinkerDatum:
    tokens: np.ndarray
    inputs: dict[str, np.ndarray]


def tinker_datum(datum: Any, index: int) -> TinkerDatum:
    chunks = list(datum.model_input)
    if any(not chunk.HasField("encoded_text") for chunk in chunks):
        raise InvalidInput(f"data[{index}]: only text model inputs (encoded_text) are supported.")
    tokens = (
        np.concatenate([np.frombuffer(c.encoded_text.tokens, "<i4") for c in chunks])
        if chunks
        else np.zeros(0, "<i4")
    )
    inputs = {}
    for name, tensor in datum.loss_fn_inputs.items():
        if tensor.HasField("sparse_csr"):
            raise InvalidInput(f"data[{index}].{name}: sparse tensors are not supported.")
        inputs[name] = wire.tensor_values(tensor)
    return TinkerDatum(tokens, inputs)


def loom_batch(
    data: list[TinkerDatum], loss_fn: str, config: dict[str, float]
) -> tuple[list[Datum], LossConfig]:
    """The data and loss of a forward_backward in Loom's terms. A cross_entropy with a
    negative weight is the SDK's `forward_backward_custom` sending a client-side loss's
    gradient (weights = -dL/dlogprob): Loom computes it as `CLIENT_LOSS`, the same value
    and gradient without the cross-entropy's rule that weights are not negative."""
    loss = builtin_loss(loss_fn, config)
    if loss.name != LossName.cross_entropy:
        return [policy_datum(d, loss, i) for i, d in enumerate(data)], loss
    weights = [per_token(d, "weights", i, default=1.0) for i, d in enumerate(data)]
    if any((w < 0).any() for w in weights):
        return [
            client_loss_datum(sequence(d, i, w == 0), (-w).tolist())
            for i, (d, w) in enumerate(zip(data, weights, strict=True))
        ], CLIENT_LOSS
    return [
        Datum(input_ids=sequence(d, i, w == 0), loss_mask=[0.0, *w])
        for i, (d, w) in enumerate(zip(data, weights, strict=True))
    ], loss


def sequence(datum: TinkerDatum, index: int, inert: np.ndarray) -> list[int]:
    """Tinker: input t[0..T-1], targets t[1..T] (position i predicts target i). Loom: one
    sequence t[0..T], position i predicting token i, so every per-token list shifts by one.
    A target that is not the next input token is accepted where it carries no loss (`inert`:
    the cookbook pads prompt positions with target 0 and weight 0); Loom then predicts the
    input there, which changes nothing since the position weighs 0."""
    targets = datum.inputs.get("target_tokens")
    n = len(datum.tokens)
    if targets is None or len(targets) != n or n == 0:
        raise InvalidInput(
            f"data[{index}]: target_tokens must have one entry per input token ({n})."
        )
    check_shifted_targets(datum.tokens, targets, ~inert, index)
    return [int(t) for t in datum.tokens] + [int(targets[-1])]


def policy_datum(datum: TinkerDatum, loss: LossConfig, index: int) -> Datum:
    """Tinker's policy losses weigh every target alike (no `weights`), except that a target
    with advantage 0 carries no gradient: one that is not the next input token (padding) is
    masked out."""
    inputs = {name: per_token(datum, name, index) for name in LOSS_INPUTS[loss.name]}
    inert = (
        inputs["advantages"] == 0
        if "advantages" in inputs
        else np.zeros(len(datum.tokens), dtype=bool)
    )
    ids = sequence(datum, index, inert)
    padded = np.append(np.asarray(ids[1:-1]) != datum.inputs["target_tokens"][:-1], False)
    mask = np.where(padded, 0.0, 1.0)
    return Datum(
        input_ids=ids,
        loss_mask=[0.0, *mask.tolist()],
        **{name: [0.0, *values.tolist()] for name, values in inputs.items()},
    )


def per_token(
    datum: TinkerDatum, name: str, index: int, default: float | None = None
) -> np.ndarray:
    values = datum.inputs.get(name)
    n = len(datum.tokens)
    if values is None:
        if default is None:
            raise InvalidInput(f"data[{index}]: this loss needs loss_fn_inputs[{name!r}].")
        return np.full(n, default)
    if len(values) != n:
        raise InvalidInput(f"data[{index}].{name} has {len(values)} entries; the input has {n}.")
    return values.astype(np.float64)


def sampling_params(params: schemas.TinkerSamplingParams) -> SamplingParams:
    stop = params.stop
    strings = [stop] if isinstance(stop, str) else [s for s in stop or [] if isinstance(s, str)]
    token_ids = [s for s in stop or [] if isinstance(s, int)] if not isinstance(stop, str) else []
    return SamplingParams(
        max_tokens=params.max_tokens or DEFAULT_MAX_TOKENS,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        seed=params.seed,
        stop=strings,
        stop_token_ids=token_ids,
    )
