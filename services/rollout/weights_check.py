"""Whether a full-weights version is weights of the served model, read from its safetensors
headers alone (a few KB each): a version whose files hash right but hold other tensors, or
are not safetensors at all, is refused with a 422 naming the first problem, before the engine
is asked to load it (a failed reload leaves the engine's weights half replaced)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from services.common.errors import InvalidInput

WEIGHTS_SUFFIX = ".safetensors"
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit

TensorSpecs = dict[str, tuple[int, ...]]  # tensor name -> shape


def tensor_specs(directory: str | Path) -> TensorSpecs:
    """Every tensor's shape, over the directory's safetensors files."""
    specs: TensorSpecs = {}
    files = sorted(Path(directory).glob(f"*{WEIGHTS_SUFFIX}"))
    if not files:
        raise InvalidInput(f"{directory} holds no {WEIGHTS_SUFFIX} files: not full weights.")
    for path in files:
        specs.update(_header(path))
    return specs


def check_loadable(directory: str | Path, served: TensorSpecs, what: str) -> None:
    """Raise InvalidInput unless every tensor of `directory` is one of the served model's,
    with its shape, and the served model's are all there."""
    found = tensor_specs(directory)
    foreign = sorted(set(found) - set(served))
    if foreign:
        raise InvalidInput(
            f"{what} is not weights of the served model: it holds tensors the "
            f"model has not, e.g. {foreign[:3]}.",
            {"unknown": foreign[:20]},
        )
    wrong = [name for name, shape in found.items() if shape != served[name]]
    if wrong:
        name = wrong[0]
        raise InvalidInput(
            f"{what} is not weights of the served model: {name} has shape "
            f"{list(found[name])}, the model's is {list(served[name])}.",
            {"tensor": name, "shape": list(found[name]), "expected": list(served[name])},
        )
    missing = sorted(set(served) - set(found))
    if missing:
        raise InvalidInput(
            f"{what} lacks tensors of the served model, e.g. {missing[:3]}.",
            {"missing": missing[:20]},
        )


def _header(path: Path) -> TensorSpecs:
    def refuse(why: str) -> InvalidInput:
        return InvalidInput(f"{path.name} is not a safetensors file: {why}.", {"file": path.name})

    with open(path, "rb") as source:
        prefix = source.read(8)
        if len(prefix) < 8:
            raise refuse("it is shorter than its header")
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_HEADER_BYTES:
            raise refuse(f"its header claims {length} bytes")
        raw = source.read(length)
    try:
        header = json.loads(raw)
        return {
            name: tuple(entry["shape"]) for name, entry in header.items() if name != "__metadata__"
        }
    except (ValueError, TypeError, KeyError) as exc:
        raise refuse(f"its header does not parse ({exc})") from exc
