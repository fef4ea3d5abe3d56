"""Downloads of a whole version: a tar stream of its Hugging Face directory, and for a LoRA
version on request the adapter merged into its base model (built once, kept under
`exports/`, deleted with the version)."""

from __future__ import annotations

import shutil
import tarfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

from modelstate.blobstore import CHUNK_BYTES, BlobStore
from modelstate.schemas import Version, VersionKind
from services.common.base_models import resolve_base_model
from services.common.errors import InvalidInput

BLOCK = tarfile.BLOCKSIZE
_merge_lock = threading.Lock()  # one merge at a time: each holds a whole model in memory


def tar_stream(files: list[tuple[str, Path]], root: str) -> Iterator[bytes]:
    """An uncompressed tar of `files` (name → path) under `root/`, produced piece by piece so
    a model of any size streams in constant memory."""
    for name, path in files:
        info = tarfile.TarInfo(f"{root}/{name}")
        info.size = path.stat().st_size
        info.mode = 0o644
        yield info.tobuf(format=tarfile.PAX_FORMAT)
        with open(path, "rb") as source:
            while chunk := source.read(CHUNK_BYTES):
                yield chunk
        if info.size % BLOCK:
            yield b"\0" * (BLOCK - info.size % BLOCK)
    yield b"\0" * (2 * BLOCK)


def version_files(blobs: BlobStore, version: Version) -> list[tuple[str, Path]]:
    return [(f.path, blobs.blob_path(f.sha256)) for f in version.files]


def merged_lora(blobs: BlobStore, version: Version, data_dir: Path) -> list[tuple[str, Path]]:
    """The files of `version` (a LoRA adapter) merged into its base: a full model directory."""
    if version.kind != VersionKind.lora:
        raise InvalidInput(
            f"Version {version.number} holds full weights; only LoRA versions "
            "are merged (download it without merge_lora)."
        )
    out = blobs.exports / version.job_id / str(version.number) / "merged"
    with _merge_lock:
        if not out.is_dir():
            _merge_into(out, blobs, version, data_dir)
    return [(p.relative_to(out).as_posix(), p) for p in sorted(out.rglob("*")) if p.is_file()]


def _merge_into(out: Path, blobs: BlobStore, version: Version, data_dir: Path) -> None:
    import peft
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_path = resolve_base_model(version.base_model, data_dir)
    adapter = blobs.version_dir(version.job_id, version.number)
    work = blobs.tmp / f"export-{uuid.uuid4().hex}"
    try:
        try:
            base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
            merged = peft.PeftModel.from_pretrained(base, adapter).merge_and_unload()
        except (OSError, ValueError) as exc:
            raise InvalidInput(
                f"Cannot merge version {version.number} into its base model "
                f"{version.base_model!r} on this host: {exc}"
            ) from exc
        merged.save_pretrained(work)
        AutoTokenizer.from_pretrained(base_path).save_pretrained(work)
        out.parent.mkdir(parents=True, exist_ok=True)
        work.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
