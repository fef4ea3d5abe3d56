"""Tinker's training data and sampling parameters as Loom's trainer and rollout take them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.tinker import schemas, wire
from services.common.errors import InvalidInput
from services.rollout.schemas import SamplingParams
from services.trainer.schemas import Datum

DEFAULT_MAX_TOKENS = 64


@dataclass(frozen=True)
class TinkerDatum:
    tokens: np.ndarray
    inputs: dict[str, np.ndarray]


def tinker_datum(datum: Any, index: int) -> TinkerDatum:
    chunks = list(datum.model_input)
    if any(not chunk.HasField("encoded_text") for chunk in chunks):
        raise InvalidInput(f"data[{index}]: only text model inputs (encoded_text) are supported.")
    tokens = np.concatenate([np.frombuffer(c.encoded_text.tokens, "<i4") for c in chunks]
                            ) if chunks else np.zeros(0, "<i4")
    inputs = {}
    for name, tensor in datum.loss_fn_inputs.items():
        if tensor.HasField("sparse_csr"):
            raise InvalidInput(f"data[{index}].{name}: sparse tensors are not supported.")
        inputs[name] = wire.tensor_values(tensor)
    return TinkerDatum(tokens, inputs)


def loom_datum(datum: TinkerDatum, loss_fn: str, index: int) -> Datum:
    """Tinker: input t[0..T-1], targets t[1..T] (position i predicts target i). Loom: one
    sequence t[0..T], position i predicting token i, so every per-token list shifts by one."""
    targets = datum.inputs.get("target_tokens")
    n = len(datum.tokens)
    if targets is None or len(targets) != n or n == 0:
        raise InvalidInput(f"data[{index}]: target_tokens must have one entry per input token "
                           f"({n}).")
    if not np.array_equal(targets[:-1], datum.tokens[1:]):
        raise InvalidInput(f"data[{index}]: target_tokens must be the input shifted by one "
                           "(input[1:] + [next token]); other targets are not supported.")
    weights = per_token(datum, "weights", index, default=1.0)
    ids = [int(t) for t in datum.tokens] + [int(targets[-1])]
    if loss_fn == "cross_entropy":
        return Datum(input_ids=ids, loss_mask=[0.0, *weights])
    return Datum(input_ids=ids, loss_mask=[0.0] + [1.0] * n,
                 advantages=[0.0, *per_token(datum, "advantages", index)],
                 logprobs=[0.0, *per_token(datum, "logprobs", index)])


def per_token(datum: TinkerDatum, name: str, index: int, default: float | None = None
              ) -> list[float]:
    values = datum.inputs.get(name)
    n = len(datum.tokens)
    if values is None:
        if default is None:
            raise InvalidInput(f"data[{index}]: this loss needs loss_fn_inputs[{name!r}].")
        return [default] * n
    if len(values) != n:
        raise InvalidInput(f"data[{index}].{name} has {len(values)} entries; the input has {n}.")
    return [float(v) for v in values]


def sampling_params(params: schemas.TinkerSamplingParams) -> SamplingParams:
    stop = params.stop
    strings = [stop] if isinstance(stop, str) else [s for s in stop or [] if isinstance(s, str)]
    token_ids = [s for s in stop or [] if isinstance(s, int)] if not isinstance(stop, str) \
        else []
    return SamplingParams(max_tokens=params.max_tokens or DEFAULT_MAX_TOKENS,
                          temperature=params.temperature, top_p=params.top_p,
                          top_k=params.top_k, seed=params.seed, stop=strings,
                          stop_token_ids=token_ids)
