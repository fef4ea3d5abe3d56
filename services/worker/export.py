"""Export of a LoRA version merged into its base model: a full Hugging Face directory under
`<exports_dir>/<job_id>/<version>/`. Written to a temporary directory next to it and renamed
into place, so the directory, once there, is complete; exporting again reuses it."""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from pathlib import Path

from modelstate.client import ModelStateClient
from modelstate.schemas import VersionKind
from modelstate.transfer import unpack_archive
from services.common.errors import InvalidInput
from services.worker.schemas import ExportedFile, ExportParams, ExportResult


async def export_merged(
    modelstate: ModelStateClient, job_id: str, params: ExportParams, exports_dir: Path
) -> ExportResult:
    version = await modelstate.get_version(job_id, params.version)
    if version.kind != VersionKind.lora:
        raise InvalidInput(
            f"Version {version.number} of job {job_id} holds full weights; only "
            "LoRA versions are exported merged (download it as it is).",
            {"version": version.number, "kind": version.kind.value},
        )
    target = exports_dir / job_id / str(version.number)
    if not target.is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        work = target.parent / f".tmp-{uuid.uuid4().hex}"
        archive = work.with_suffix(".tar")
        try:
            await modelstate.download_archive(version, archive, merge_lora=True)
            await asyncio.to_thread(_unpack_into_place, archive, work, target)
        finally:
            archive.unlink(missing_ok=True)
    files = [
        ExportedFile(path=p.relative_to(target).as_posix(), size=p.stat().st_size)
        for p in sorted(target.rglob("*"))
        if p.is_file()
    ]
    return ExportResult(version=version.number, path=str(target), files=files)


def _unpack_into_place(archive: Path, work: Path, target: Path) -> None:
    try:
        unpack_archive(archive, work)
        try:
            os.rename(work, target)
        except OSError:
            if not target.is_dir():  # not an export that finished first: a real failure
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
