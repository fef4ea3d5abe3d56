"""Wire models of the model-state store (imported by the SDK, trainer and rollout too)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Self

from pydantic import Field, model_validator

from services.common.schemas import LenientModel, StrictModel

JobId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
ALIAS_PATTERN = r"^[A-Za-z_][A-Za-z0-9._-]{0,63}$"
AliasName = Annotated[str, Field(min_length=1, max_length=64, pattern=ALIAS_PATTERN)]
# Version numbers are an INTEGER column: a larger one names no version, and would overflow
# the query on PostgreSQL (and SQLite past 64 bits), a 500 instead of a 404.
MAX_VERSION_NUMBER = 2**31 - 1
VersionNumber = Annotated[int, Field(ge=1, le=MAX_VERSION_NUMBER)]
Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
StagingName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
MAX_FILES = 10_000


class VersionKind(StrEnum):
    full = "full"
    lora = "lora"


class ManifestFile(LenientModel):
    path: str
    size: int
    sha256: str


class FileRef(StrictModel):
    """One file of a version to publish: its blob must have been uploaded (or be staged)."""

    path: str = Field(min_length=1, max_length=1024)
    sha256: Sha256Hex
    size: int = Field(ge=0)


class VersionMeta(StrictModel):
    """What a publisher says about a version besides its files."""

    job_id: JobId
    kind: VersionKind
    base_model: str = Field(min_length=1, max_length=1024)
    step: int | None = Field(default=None, ge=0)
    parent: int | None = Field(default=None, ge=0)
    metrics: dict[str, float] = {}
    aliases: list[AliasName] = Field(default=[], max_length=32)


class PublishRequest(VersionMeta):
    """Commit a version from blobs already in the store (`files`), or from a staging directory
    written on the store's own filesystem (`staged`; `files` then optionally declares hashes
    the store checks). Publishing a step the job already has returns that version when the
    files are the same and is a conflict when they differ."""

    files: list[FileRef] = Field(default=[], max_length=MAX_FILES)
    staged: StagingName | None = Field(
        default=None, description="Name of a directory under the store's staging_dir."
    )

    @model_validator(mode="after")
    def _has_files(self) -> Self:
        if not self.files and self.staged is None:
            raise ValueError("a version needs files: list them in `files` or give `staged`")
        return self


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


class PendingVersion(LenientModel):
    """A staged publish the store has started to verify (the `pending` event): on the store's
    host, its files can be read at `local_path` at once. A hint, never a promise: the version
    exists only once its `version` event arrives. Its files are then these files, verified,
    except where the store already held the same content (a link to that older file)."""

    job_id: str
    kind: VersionKind
    staged: str
    local_path: str
    files: dict[str, int] = Field(description="Path → size of every staged file.")


class VersionList(LenientModel):
    versions: list[Version]


class Lineage(LenientModel):
    """A version and its ancestors, newest first. `complete` is false when an ancestor was
    deleted, so the chain stops before reaching the base model."""

    versions: list[Version]
    complete: bool


class FileChange(LenientModel):
    path: str
    a: ManifestFile
    b: ManifestFile


class ManifestDiff(LenientModel):
    job_id: str
    a: int
    b: int
    added: list[ManifestFile]
    removed: list[ManifestFile]
    changed: list[FileChange]
    unchanged: list[str]
    shared_bytes: int = Field(description="Bytes of b that are stored once for both.")


class MoveAlias(StrictModel):
    number: VersionNumber


class Alias(LenientModel):
    job_id: str
    name: str
    number: int


class StoredBlob(LenientModel):
    sha256: str
    size: int


class StoreInfo(LenientModel):
    """What a client needs to publish cheaply: a writer that can see `staging_dir` and read
    `instance_id` from its marker file shares the store's filesystem and may stage files
    there instead of uploading them."""

    instance_id: str
    staging_dir: str
    marker_file: str
    max_file_bytes: int


class VersionKey(StrictModel):
    job_id: JobId
    number: VersionNumber


class PinRequest(StrictModel):
    """Replace every pin of one holder (e.g. a rollout engine's resident versions)."""

    versions: list[VersionKey] = Field(max_length=1024)
    ttl_s: float = Field(default=60.0, gt=0, le=86_400)


class Pin(LenientModel):
    holder: str
    job_id: str
    number: int
    expires_at: datetime


class PinList(LenientModel):
    pins: list[Pin]


class RetentionPolicy(StrictModel):
    keep_last: int = Field(
        ge=0,
        description="Keep the newest N versions (0: keep all); aliased and pinned "
        "versions are always kept.",
    )
    keep_ancestors: bool = Field(
        default=False, description="Also keep every ancestor of an aliased version."
    )


class Retention(LenientModel):
    job_id: str
    keep_last: int
    keep_ancestors: bool
    is_default: bool


class GcReport(LenientModel):
    versions_deleted: list[str] = Field(description="`job@number` of each deleted version.")
    blobs_deleted: int
    bytes_freed: int
    temp_entries_removed: int
    stray_entries_removed: int = Field(
        description="Files or directories no row accounts for (left by a crash)."
    )
