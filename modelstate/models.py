"""Database rows of the model-state store. Migrations: `modelstate/alembic` (never create_all)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON,
    BigInteger,
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


class VersionRow(Base):
    """One immutable published version; `number` counts from 1 per job, `id` is global and
    orders the event stream."""

    __tablename__ = "versions"
    __table_args__ = (UniqueConstraint("job_id", "number", name="uq_versions_job_number"),)

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
    sha256: Mapped[str] = mapped_column(String(64))


class AliasRow(Base):
    """A movable name for one version of a job; the foreign key keeps it pointing at a real one."""

    __tablename__ = "aliases"
    __table_args__ = (
        ForeignKeyConstraint(
            ["job_id", "number"], ["versions.job_id", "versions.number"],
            name="fk_aliases_version", ondelete="CASCADE",
        ),
    )

    job_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    number: Mapped[int] = mapped_column(Integer)
