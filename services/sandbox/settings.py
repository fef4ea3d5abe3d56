"""Sandbox service settings (`LOOM_SANDBOX_*`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from services.common.settings import LoomSettings


class SandboxSettings(LoomSettings):
    sandbox_backend: Literal["process"] = Field(
        default="process", description="How code is isolated: `process` (rlimits, namespaces)."
    )
    sandbox_max_concurrency: int = Field(
        default=4, ge=1, le=256, description="Executions running at once; the rest wait."
    )
    sandbox_python: str | None = Field(
        default=None,
        description="Interpreter for sandboxed code. Default: the service's own Python if the "
        "sandbox user can run it, else the first of /usr/local/bin/python3, /usr/bin/python3.",
    )
    sandbox_user_id_base: int | None = Field(
        default=61000,
        ge=1000,
        description="When the service runs as root, execution slot i runs as uid/gid base+i "
        "(no passwd entry needed), so sandboxes cannot read the service's files or signal "
        "each other. None: run as the service's user.",
    )
    sandbox_max_processes: int = Field(
        default=64, ge=1, description="RLIMIT_NPROC per sandbox (only enforced with a slot uid)."
    )
    sandbox_max_file_mb: int = Field(default=64, ge=1, description="RLIMIT_FSIZE per file.")
    sandbox_max_open_files: int = Field(default=256, ge=16, description="RLIMIT_NOFILE.")
    sandbox_output_overflow_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=0,
        description="Output drained (and dropped) past max_output_bytes before the program is "
        "killed as a flood.",
    )
    sandbox_work_root: Path | None = Field(
        default=None, description="Parent of the per-execution temp dirs (default: system temp)."
    )
