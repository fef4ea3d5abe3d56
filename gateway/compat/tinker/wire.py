"""The protobuf messages of the Tinker protocol that Loom reads and writes.

The SDK sends `forward_backward` as protobuf and accepts only protobuf for the results of
forward/backward and sampling. The message classes are built here from a descriptor written
from the protocol's field numbers (only what Loom uses: unknown fields are skipped on parse).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from services.rollout.schemas import RankedLogprobs, Sample

Field = descriptor_pb2.FieldDescriptorProto
OPTIONAL, REPEATED = Field.LABEL_OPTIONAL, Field.LABEL_REPEATED
SCALARS = {
    "bytes": Field.TYPE_BYTES,
    "string": Field.TYPE_STRING,
    "int32": Field.TYPE_INT32,
    "int64": Field.TYPE_INT64,
    "bool": Field.TYPE_BOOL,
    "double": Field.TYPE_DOUBLE,
    "uint32": Field.TYPE_UINT32,
}
PACKAGE = "loom.tinker_wire"

# DType enum values on the wire.
FLOAT32, INT64, INT32 = 1, 2, 3
NUMPY_DTYPES = {FLOAT32: "<f4", INT64: "<i8", INT32: "<i4"}
STOP_REASON_STOP, STOP_REASON_LENGTH = 0, 1
EMPTY_TOP_LOGPROB = -99999.0  # a top-k cell without a token (token id 0), as the SDK reads it

# message -> [(field, number, type or message, repeated)]; "map:K:V" declares a map field.
MESSAGES: dict[str, list[tuple[str, int, str, bool]]] = {
    "EncodedTextChunk": [("tokens", 1, "bytes", False)],
    # image and dmel are messages on the wire; read as bytes they only need to be seen.
    "Chunk": [
        ("encoded_text", 1, "EncodedTextChunk", False),
        ("image", 2, "bytes", False),
        ("dmel", 3, "bytes", False),
    ],
    "SparseCsr": [("values", 1, "bytes", False)],
    "Tensor": [
        ("dense", 1, "bytes", False),
        ("sparse_csr", 2, "SparseCsr", False),
        ("dtype", 3, "int32", False),
        ("shape", 4, "int64", True),
    ],
    "Datum": [("model_input", 1, "Chunk", True), ("loss_fn_inputs", 2, "map:string:Tensor", True)],
    "LossConfigValue": [("number", 1, "double", False), ("text", 2, "string", False)],
    "ForwardBackwardRequest": [
        ("model_id", 1, "string", False),
        ("seq_id", 2, "int32", False),
        ("data", 3, "Datum", True),
        ("loss_fn", 4, "string", False),
        ("loss_fn_config", 5, "map:string:double", True),
        ("forward_only", 6, "bool", False),
        ("loss_fn_config_v2", 7, "map:string:LossConfigValue", True),
    ],
    "BatchedTensor": [
        ("data", 1, "bytes", False),
        ("offsets", 2, "bytes", False),
        ("dtype", 3, "int32", False),
        ("trailing_shape", 4, "int64", True),
    ],
    "ArrayRecord": [
        ("type_tag", 1, "string", False),
        ("fields", 2, "map:string:BatchedTensor", True),
        ("num_datums", 3, "int64", False),
    ],
    "ForwardBackwardOutput": [
        ("loss_fn_output_type", 1, "string", False),
        ("loss_fn_outputs", 2, "ArrayRecord", True),
        ("metrics", 3, "map:string:double", True),
    ],
    # Dense length x k matrices, row-major: int32 token ids and float32 logprobs.
    "TopkLogprobs": [
        ("token_ids", 1, "bytes", False),
        ("logprobs", 2, "bytes", False),
        ("k", 3, "uint32", False),
        ("length", 4, "uint32", False),
    ],
    "SampledSequence": [
        ("stop_reason", 1, "int32", False),
        ("tokens", 2, "bytes", False),
        ("logprobs", 3, "bytes", False),
        ("topk_sampled_logprobs", 4, "TopkLogprobs", False),
    ],
    "SampleResponse": [
        ("sequences", 1, "SampledSequence", True),
        ("prompt_logprobs", 2, "bytes", False),
        ("topk_prompt_logprobs", 3, "TopkLogprobs", False),
    ],
}


def _set_type(field: Any, type_name: str) -> None:
    if type_name in SCALARS:
        field.type = SCALARS[type_name]
    else:
        field.type = Field.TYPE_MESSAGE
        field.type_name = f".{PACKAGE}.{type_name}"


def _descriptor() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(
        name="loom_tinker_wire.proto", package=PACKAGE, syntax="proto3"
    )
    for name, fields in MESSAGES.items():
        message = file.message_type.add(name=name)
        for field_name, number, type_name, repeated in fields:
            field = message.field.add(
                name=field_name, number=number, label=REPEATED if repeated else OPTIONAL
            )
            if type_name.startswith("map:"):
                _, key, value = type_name.split(":")
                entry = message.nested_type.add(name=f"{field_name.title().replace('_', '')}Entry")
                entry.options.map_entry = True
                _set_type(entry.field.add(name="key", number=1, label=OPTIONAL), key)
                _set_type(entry.field.add(name="value", number=2, label=OPTIONAL), value)
                field.type = Field.TYPE_MESSAGE
                field.type_name = f".{PACKAGE}.{name}.{entry.name}"
            else:
                _set_type(field, type_name)
    return file


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_descriptor())
_CLASSES = {
    name: message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))
    for name in MESSAGES
}

ForwardBackwardRequest = _CLASSES["ForwardBackwardRequest"]
ForwardBackwardOutput = _CLASSES["ForwardBackwardOutput"]
SampleResponse = _CLASSES["SampleResponse"]


def numbering(body: bytes) -> tuple[str | None, int | None]:
    """The model id and seq_id of a ForwardBackwardRequest body (None where unreadable)."""
    request = ForwardBackwardRequest()
    try:
        request.ParseFromString(body)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError and friends: nothing to number
        return None, None
    return request.model_id or None, request.seq_id


def tensor_values(tensor: Any) -> np.ndarray:
    """A dense wire tensor as a flat numpy array (sparse ones are refused by the caller)."""
    return np.frombuffer(tensor.dense, dtype=NUMPY_DTYPES[tensor.dtype or FLOAT32])


def forward_backward_output(logprobs: list[list[float]], metrics: dict[str, float]) -> bytes:
    """Per-datum logprobs of the target tokens as one batched float32 record."""
    out = ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    record = out.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(logprobs))
    arrays = [np.asarray(values, dtype="<f4") for values in logprobs]
    offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype("<i8")
    field = record.fields["logprobs"]
    field.data = b"".join(a.tobytes() for a in arrays)
    field.offsets = offsets.tobytes()
    field.dtype = FLOAT32
    for name, value in metrics.items():
        out.metrics[name] = value
    return bytes(out.SerializeToString())


def sample_response(
    samples: list[Sample],
    prompt_logprobs: list[float | None] | None = None,
    prompt_top: list[RankedLogprobs | None] | None = None,
    top_k: int = 0,
    prompt_top_k: int = 0,
) -> bytes:
    """Samples with their logprobs, and what was asked of the prompt: its logprobs (NaN where
    none, as the SDK reads them) and the top `prompt_top_k` tokens at each position; `top_k`
    > 0 adds each sample's own top-k matrix."""
    out = SampleResponse()
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(
            [np.nan if lp is None else lp for lp in prompt_logprobs], dtype="<f4"
        ).tobytes()
    if prompt_top is not None and prompt_top_k:
        _top_matrix(out.topk_prompt_logprobs, prompt_top, prompt_top_k)
    for sample in samples:
        sequence = out.sequences.add(
            tokens=np.asarray(sample.token_ids, dtype="<i4").tobytes(),
            logprobs=np.asarray(sample.logprobs, dtype="<f4").tobytes(),
            stop_reason=STOP_REASON_LENGTH if sample.stop_reason == "length" else STOP_REASON_STOP,
        )
        if sample.top_logprobs is not None and top_k:
            _top_matrix(sequence.topk_sampled_logprobs, sample.top_logprobs, top_k)
    return bytes(out.SerializeToString())


def _top_matrix(message: Any, rows: list[RankedLogprobs | None], k: int) -> None:
    token_ids = np.zeros((len(rows), k), dtype="<i4")
    logprobs = np.full((len(rows), k), EMPTY_TOP_LOGPROB, dtype="<f4")
    for i, row in enumerate(rows):
        for j, (token_id, logprob) in enumerate((row or [])[:k]):
            token_ids[i, j], logprobs[i, j] = token_id, logprob
    message.token_ids, message.logprobs = token_ids.tobytes(), logprobs.tobytes()
    message.k, message.length = k, len(rows)
