"""Weaver's training data, losses and sampling parameters as Loom's trainer and rollout take
them, and their results as the SDK reads them.

Weaver, like Tinker, gives each datum its input tokens t[0..T-1] and one target per position
(`target_tokens`, -100 where a position carries no loss). Loom's trainer takes one sequence
whose position i predicts token i, so Loom's sequence is the input plus the last target, and
every per-target list moves one place right.
"""

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
from gateway.compat.weaver import schemas
from services.common.errors import InvalidInput
from services.rollout.schemas import SampleResponse, SamplingParams
from services.trainer.schemas import LOSS_INPUTS, Datum, LossConfig

IGNORED = -100  # a target without loss
DEFAULT_MAX_TOKENS = 64
FORWARD_ONLY = "forward_logprob"  # logprobs of the targets, no loss
# forward_backward_custom's second call: the client loss's gradient by each target's logprob.
SURROGATE = "surrogate"


@dataclass(frozen=True)
class TrainingBatch:
    """A forward or forward_backward request in Loom's terms."""

    data: list[Datum]
    loss: LossConfig | None  # None: forward_logprob
    targets: list[np.ndarray]  # each datum's target_tokens, to shape the outputs
    datum_ids: list[str | None]


def training_batch(request: schemas.PassInput) -> TrainingBatch:
    loss = loss_config(request.loss_fn, request.loss_fn_config or {})
    data, targets = [], []
    for index, raw in enumerate(request.data):
        datum, target = loom_datum(raw, loss, index)
        data.append(datum)
        targets.append(target)
    return TrainingBatch(data, loss, targets, [d.datum_id for d in request.data])


def loss_config(loss_fn: str, config: dict[str, Any]) -> LossConfig | None:
    if loss_fn == FORWARD_ONLY:
        return None
    if loss_fn == SURROGATE:
        return CLIENT_LOSS
    return builtin_loss(loss_fn, config)


def loom_datum(raw: schemas.Datum, loss: LossConfig | None, index: int) -> tuple[Datum, np.ndarray]:
    if raw.model_input is None:
        raise InvalidInput(
            f"data[{index}]: managed-dataset samples (sample_ref) are not "
            "served by Loom; send model_input tokens."
        )
    if any(chunk.type != "encoded_text" for chunk in raw.model_input.chunks):
        raise InvalidInput(f"data[{index}]: only text model inputs (encoded_text) are served.")
    tokens = np.asarray(raw.model_input.tokens(), dtype=np.int64)
    n = len(tokens)
    targets = per_target(raw, "target_tokens", index, n)
    if targets is None:
        raise InvalidInput(
            f"data[{index}]: loss_fn_inputs needs target_tokens, one per input token ({n})."
        )
    targets = targets.astype(np.int64)
    scored = targets != IGNORED
    weighed = scored.copy()  # a target with weight (or loss_mask) 0 carries no loss either
    for name in ("weights", "loss_mask"):
        given = per_target(raw, name, index, n)
        if given is not None:
            weighed &= given != 0
    check_shifted_targets(tokens, targets, weighed, index)
    ids = [int(t) for t in tokens] + ([int(targets[-1])] if scored[-1] else [])
    if len(ids) < 2:
        raise InvalidInput(f"data[{index}]: needs at least one target after the first token.")
    if loss is None:  # forward_logprob: no loss, the mask only has to be valid
        return Datum(input_ids=ids, loss_mask=[0.0] * len(ids)), targets
    last = len(ids) - 1  # targets past the sequence's end (-100 at the end) are dropped
    if loss is CLIENT_LOSS:
        gradient = required(raw, "surrogate_weights", index, n, SURROGATE)
        return client_loss_datum(
            ids, gradient[:last].tolist(), scored[:last].astype(np.float64).tolist()
        ), targets
    weight = scored.astype(np.float64)
    for name in ("weights", "loss_mask"):
        given = per_target(raw, name, index, n)
        if given is not None:
            weight = weight * given
    if (weight < 0).any():
        raise InvalidInput(f"data[{index}]: weights and loss_mask must not be negative.")
    shifted = {"loss_mask": weight}
    for name in LOSS_INPUTS[loss.name]:
        shifted[name] = required(raw, name, index, n, loss.name.value)
    fields = {name: [0.0, *values[:last].tolist()] for name, values in shifted.items()}
    return Datum(input_ids=ids, **fields), targets


def required(raw: schemas.Datum, name: str, index: int, n: int, loss: str) -> np.ndarray:
    given = per_target(raw, name, index, n)
    if given is None:
        raise InvalidInput(f"data[{index}]: the {loss} loss needs loss_fn_inputs[{name!r}].")
    return given


def per_target(raw: schemas.Datum, name: str, index: int, n: int) -> np.ndarray | None:
    value = raw.loss_fn_inputs.get(name)
    if value is None:
        return None
    data = value.data if isinstance(value, schemas.TensorData) else value
    try:
        array = np.asarray(data, dtype=np.float64)
    except (TypeError, ValueError):
        array = np.zeros((0, 0))
    if array.ndim != 1 or len(array) != n:
        raise InvalidInput(
            f"data[{index}].loss_fn_inputs[{name!r}] must be a flat list of "
            f"{n} numbers, one per input token."
        )
    return array


def outputs(
    batch: TrainingBatch, logprobs: list[list[float]], loss: float | None
) -> dict[str, Any]:
    """One logprob per target (0.0 where -100), as the SDK's loss_fn_outputs: at the top
    level, as the SDK's own parser reads them, and under `result`, where the official
    examples read them (`result["result"]["loss_fn_outputs"]`)."""
    per_datum = []
    for row, targets, datum_id in zip(logprobs, batch.targets, batch.datum_ids, strict=True):
        values = np.zeros(len(targets))
        scored = row[1:]
        values[: len(scored)] = scored
        values[targets == IGNORED] = 0.0
        output: dict[str, Any] = {"logprobs": {"data": values.tolist(), "dtype": "float32"}}
        if datum_id is not None:
            output["datum_id"] = datum_id
        per_datum.append(output)
    metrics = {} if loss is None else {"loss:sum": loss}
    body = {"loss_fn_output_type": "TensorData", "loss_fn_outputs": per_datum, "metrics": metrics}
    return {**body, "result": body}


def sampling_params(spec: schemas.SamplingSpec) -> SamplingParams:
    return SamplingParams(
        max_tokens=spec.max_tokens or DEFAULT_MAX_TOKENS,
        temperature=spec.temperature,
        top_p=spec.top_p,
        top_k=spec.top_k,
        stop=spec.stop,
        stop_token_ids=spec.stop_token_ids,
        seed=spec.sampling_seed if spec.seed is None else spec.seed,
    )


def sequences(response: SampleResponse, prompt_logprobs: bool) -> dict[str, Any]:
    """The samples; the prompt's logprobs if asked, and its top-k tokens at each position
    (`[[token id, logprob], ...]`, None for the first) if asked."""
    version = response.version
    result: dict[str, Any] = {
        "sequences": [
            {
                "tokens": s.token_ids,
                "logprobs": s.logprobs,
                "text": s.text,
                "stop_reason": s.stop_reason,
                "weight_version": version,
            }
            for s in response.samples
        ],
        "weight_version": version,
    }
    if prompt_logprobs:
        result["prompt_logprobs"] = response.prompt_logprobs
    if response.prompt_top_logprobs is not None:
        result["topk_prompt_logprobs"] = [
            None if row is None else [list(p) for p in row] for row in response.prompt_top_logprobs
        ]
    return result
