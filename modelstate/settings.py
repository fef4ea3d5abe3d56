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
