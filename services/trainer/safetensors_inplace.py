"""Write a safetensors file into an existing file's pages, not a new file's.

`safetensors.torch.save_file` creates its file afresh (truncating), so its bytes always land
in page cache allocated at that moment. Writing over an existing file instead reuses the
pages that file already has cached (see `page_reserve`). The layout is the safetensors one
(https://huggingface.co/docs/safetensors, "Format"): an 8-byte little-endian header length,
the JSON header padded with spaces to a multiple of 8, then each tensor's bytes, contiguous and
in header order. Tests read every file back with `safetensors` itself.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch

DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
MAX_WRITE = 1 << 30  # Linux writes at most ~2 GiB per call


def write_file(
    tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None
) -> None:
    """Like `save_file`, but an existing `path` is written over in place and cut to size."""
    ordered = sorted(tensors.items(), key=lambda item: (-item[1].element_size(), item[0]))
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, tensor in ordered:
        if tensor.dtype not in DTYPES:
            raise ValueError(f"safetensors has no dtype for {name}'s {tensor.dtype}")
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        position = _write_all(descriptor, struct.pack("<Q", len(encoded)) + encoded, 0)
        for _, tensor in ordered:
            position = _write_all(descriptor, _bytes_of(tensor), position)
        os.ftruncate(descriptor, position)
    finally:
        os.close(descriptor)


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy (CPU, contiguous); other tensors are copied once."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def _write_all(descriptor: int, data: memoryview | bytes, position: int) -> int:
    view = memoryview(data)
    while view:
        written = os.pwrite(descriptor, view[:MAX_WRITE], position)
        view = view[written:]
        position += written
    return position
