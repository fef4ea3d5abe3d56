"""Wire models of the model-state store (imported by the SDK, trainer and rollout too)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import Field

from services.common.schemas import LenientModel, StrictModel

JobId = Annotated[
    str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]
AliasName = Annotated[
    str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9._-]*$")
]
Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-fA-F]{64}$")]


class VersionKind(StrEnum):
    full = "full"
    lora = "lora"


class ManifestFile(LenientModel):
    path: str
    size: int
    sha256: str


class PublishRequest(StrictModel):
    """The `meta` part of a multipart publish; the files come as `files` parts."""

    job_id: JobId
    kind: VersionKind
    base_model: str = Field(min_length=1, max_length=1024)
    step: int | None = Field(default=None, ge=0)
    parent: int | None = Field(default=None, ge=0)
    metrics: dict[str, float] = {}
    aliases: list[AliasName] = []
    sha256: dict[str, Sha256Hex] = Field(
        default={}, description="Declared sha256 per file path; the store verifies each one."
    )


class Version(LenientModel):
    """An immutable published version. `number` counts from 1 per job; 0 is the base model."""

    id: int
    job_id: str
    number: int
    parent: int | None
    step: int | None
    kind: VersionKind
    base_model: str
    files: list[ManifestFile]
    metrics: dict[str, float]
    aliases: list[str]
    created_at: datetime
    local_path: str | None = Field(
        default=None, description="Directory holding the files on the store's host, if local."
    )


class VersionList(LenientModel):
    versions: list[Version]


class MoveAlias(StrictModel):
    number: int = Field(ge=1)


class Alias(LenientModel):
    job_id: str
    name: str
    number: int
