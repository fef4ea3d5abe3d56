"""Settings of the model-state store (`LOOM_MODELSTATE_*`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from services.common.settings import LoomSettings


class ModelStateSettings(LoomSettings):
    modelstate_blob_dir: Path = Field(
        default_factory=lambda data: Path(data["data_dir"]) / "blobs",
        description="Blobs and materialized version directories; default: <data_dir>/blobs.",
    )
    modelstate_max_file_bytes: int = Field(
        default=64 * 2**30, gt=0, description="Largest single file a publish may upload."
    )
    modelstate_sse_heartbeat_s: float = Field(
        default=15.0, gt=0, description="Seconds between SSE keep-alive comments."
    )
    modelstate_keep_last: int = Field(
        default=0,
        ge=0,
        description="Default retention: keep each job's newest N versions "
        "(0: keep all). Aliased and pinned versions are always kept; jobs may set their own "
        "policy (PUT /v1/jobs/{job}/retention).",
    )
    modelstate_keep_ancestors: bool = Field(
        default=False, description="Default retention: also keep ancestors of aliased versions."
    )
    modelstate_gc_interval_s: float = Field(
        default=600.0,
        ge=0,
        description="Seconds between garbage collections (0: only on "
        "POST /v1/gc). Retention of a job is also applied right after each publish.",
    )
    modelstate_gc_grace_s: float = Field(
        default=3600.0,
        ge=0,
        description="Unreferenced blobs, temp files and staging "
        "directories younger than this are never collected (publishes in progress).",
    )
