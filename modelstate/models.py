"""Database rows of the model-state store. Migrations: `modelstate/alembic` (never create_all)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Integer,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


class Base(DeclarativeBase):
    pass


class BlobRow(Base):
    """One stored content (`sha256/<ab>/<hex>` on disk). A row exists once the file is in
    place; `touched_at` is refreshed by every upload and publish that uses it, so garbage
    collection leaves alone a blob that a publish in progress is about to reference."""

    __tablename__ = "blobs"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    touched_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class VersionRow(Base):
    """One immutable published version; `number` counts from 1 per job, `id` is global and
    orders the event stream. A training step is published at most once per job."""

    __tablename__ = "versions"
    __table_args__ = (
        UniqueConstraint("job_id", "number", name="uq_versions_job_number"),
        UniqueConstraint("job_id", "step", name="uq_versions_job_step"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(128))
    number: Mapped[int] = mapped_column(Integer)
    parent: Mapped[int | None] = mapped_column(Integer)
    step: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    base_model: Mapped[str] = mapped_column(String(1024))
    metrics: Mapped[dict[str, float]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    files: Mapped[list[VersionFileRow]] = relationship(
        order_by="VersionFileRow.path", lazy="selectin", cascade="all, delete-orphan"
    )


class VersionFileRow(Base):
    __tablename__ = "version_files"

    version_id: Mapped[int] = mapped_column(
        ForeignKey("versions.id", ondelete="CASCADE"), primary_key=True
    )
    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    # No cascade: a blob that a version references cannot be deleted.
    sha256: Mapped[str] = mapped_column(
        ForeignKey("blobs.sha256", name="fk_files_blob"), index=True
    )


class AliasRow(Base):
    """A movable name for one version of a job; the foreign key keeps it pointing at a real one."""

    __tablename__ = "aliases"
    __table_args__ = (
        ForeignKeyConstraint(
            ["job_id", "number"],
            ["versions.job_id", "versions.number"],
            name="fk_aliases_version",
            ondelete="CASCADE",
        ),
    )

    job_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    number: Mapped[int] = mapped_column(Integer)


class PinRow(Base):
    """A lease by a consumer (a rollout engine serving the version) that keeps a version from
    being deleted until `expires_at`; holders renew their pins while they serve."""

    __tablename__ = "pins"
    __table_args__ = (
        ForeignKeyConstraint(
            ["job_id", "number"],
            ["versions.job_id", "versions.number"],
            name="fk_pins_version",
            ondelete="CASCADE",
        ),
    )

    holder: Mapped[str] = mapped_column(String(256), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class RetentionRow(Base):
    """A job's own retention policy; jobs without one use the store's default."""

    __tablename__ = "retention"

    job_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    keep_last: Mapped[int] = mapped_column(Integer)
    keep_ancestors: Mapped[bool] = mapped_column(Boolean)
