"""Wire models of the sandbox service."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from services.common.schemas import LenientModel, StrictModel


class Language(StrEnum):
    python = "python"


class ExecutionStatus(StrEnum):
    ok = "ok"
    error = "error"
    timeout = "timeout"
    oom = "oom"
    killed = "killed"


class ExecuteRequest(StrictModel):
    language: Language = Language.python
    code: str = Field(min_length=1, max_length=1_000_000)
    stdin: str = Field(default="", max_length=10_000_000)
    timeout_s: float = Field(default=10.0, gt=0, le=300)
    memory_mb: int = Field(default=512, ge=16, le=16384)
    max_output_bytes: int = Field(default=65536, ge=1, le=10_000_000)


class ExecuteResponse(LenientModel):
    status: ExecutionStatus
    exit_code: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    wall_s: float
    cpu_s: float
    signal: int | None = Field(default=None, description="The signal that ended the program")
    reason: str | None = Field(
        default=None, description="Why the sandbox stopped the program: timeout | output_limit"
    )
