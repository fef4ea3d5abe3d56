"""Wire models of the sandbox service."""

from __future__ import annotations

import base64
import binascii
import posixpath
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from services.common.schemas import LenientModel, StrictModel

MAX_FILES = 100
MAX_FILES_IN_BYTES = 16 * 1024 * 1024


class Language(StrEnum):
    python = "python"
    bash = "bash"


def _relative_path(path: str) -> str:
    """A path inside the workdir: relative, normalised, no `..`, not the program file."""
    if not path or "\x00" in path or path.startswith("/"):
        raise ValueError(f"{path!r} must be a non-empty path relative to the workdir")
    if posixpath.normpath(path) != path or path.split("/")[0] == "..":
        raise ValueError(
            f"{path!r} must be normalised and stay inside the workdir "
            "(no '..', '.', '//' or trailing '/')"
        )
    if path in ("main.py", "main.sh"):
        raise ValueError(f"{path!r} is where the program itself is written")
    return path


WorkdirPath = Annotated[str, Field(max_length=1024), AfterValidator(_relative_path)]


class FileIn(StrictModel):
    """A file written into the workdir before the program starts, as the program's user."""

    path: WorkdirPath
    content: str
    encoding: Literal["utf-8", "base64"] = "utf-8"

    def data(self) -> bytes:
        if self.encoding == "utf-8":
            return self.content.encode()
        return base64.b64decode(self.content, validate=True)

    @model_validator(mode="after")
    def _decodable(self) -> FileIn:
        try:
            self.data()
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"{self.path}: content is not valid base64") from exc
        return self


def _files_fit(files: list[FileIn]) -> list[FileIn]:
    if sum(len(f.content) for f in files) > MAX_FILES_IN_BYTES:
        raise ValueError(f"files add up to more than {MAX_FILES_IN_BYTES} bytes")
    if len({f.path for f in files}) != len(files):
        raise ValueError("two files have the same path")
    return files


# Files to write into the workdir: one shape and the same bounds wherever they are accepted.
FileList = Annotated[list[FileIn], Field(max_length=MAX_FILES), AfterValidator(_files_fit)]


class FileOut(LenientModel):
    """A file the request asked to collect after the program ended."""

    path: str
    content: str | None = Field(default=None, description="base64; None when `error` is set")
    size: int | None = None
    error: str | None = Field(
        default=None, description="missing | not a regular file | too large (with the limit)"
    )

    def data(self) -> bytes:
        if self.content is None:
            raise ValueError(f"{self.path} was not collected: {self.error}")
        return base64.b64decode(self.content)


class ExecutionStatus(StrEnum):
    ok = "ok"
    error = "error"
    timeout = "timeout"
    oom = "oom"
    killed = "killed"


class ExecuteRequest(StrictModel):
    language: Language = Language.python
    image: str | None = Field(
        default=None,
        max_length=256,
        description="docker backend: one of the images the service serves (default: its first)",
    )
    code: str = Field(min_length=1, max_length=1_000_000)
    stdin: str = Field(default="", max_length=10_000_000)
    timeout_s: float = Field(default=10.0, gt=0, le=300)
    memory_mb: int = Field(default=512, ge=16, le=16384)
    max_output_bytes: int = Field(default=65536, ge=1, le=10_000_000)
    files: FileList = Field(default_factory=list)
    collect: list[WorkdirPath] = Field(
        default_factory=list,
        max_length=MAX_FILES,
        description="Workdir files to return after the program ends (base64, bounded).",
    )


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
    files: list[FileOut] = Field(default_factory=list)


class SessionCreate(StrictModel):
    job_id: str | None = Field(
        default=None, max_length=128, description="Counts against the job's session limit."
    )
    image: str | None = Field(
        default=None, max_length=256, description="docker backend: the image the session runs in"
    )


class SessionInfo(LenientModel):
    id: str
    job_id: str | None
    created_at: float
    idle_timeout_s: float
    idle_s: float


class FilesWrite(StrictModel):
    files: FileList = Field(min_length=1)


class FilesRead(LenientModel):
    files: list[FileOut]
