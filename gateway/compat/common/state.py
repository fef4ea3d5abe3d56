"""What Tinker's and Weaver's layers keep between an SDK's calls, read and written through
the gateway's database (`rows`), so any gateway replica serves the next call: sessions,
sampling sessions and named sampler weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from gateway.auth.keys import KeyIdentity
from gateway.compat.common.rows import (
    CompatSamplerRow,
    CompatSamplerWeightsRow,
    CompatSessionRow,
)
from services.common.db import in_transaction


@dataclass(frozen=True)
class SdkSession:
    owner: str
    name: str | None
    created_at: datetime
    models: dict[int, str]  # Weaver's model_seq_id -> model id


@dataclass(frozen=True)
class SamplerRef:
    """A sampling session, or sampler weights saved by name: a (job, version) of rollout's."""

    owner: str | None
    base_model: str  # as the SDK named it
    job_id: str | None  # None: the base model
    version: int
    model_path: str | None = None
    tokenizer_path: str | None = None
    saved_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    expires_at: datetime | None = None  # named sampler weights: forgotten from then on


class SdkState:
    def __init__(self, db: sessionmaker[Session], protocol: str) -> None:
        self.db = db
        self.protocol = protocol

    # --- sessions -------------------------------------------------------------------------

    async def add_session(
        self, session_id: str, owner: KeyIdentity, name: str | None = None
    ) -> SdkSession:
        row = CompatSessionRow(
            id=session_id,
            protocol=self.protocol,
            owner_key_id=owner.id,
            name=name,
            models={},
            created_at=datetime.now(UTC),
        )
        await in_transaction(self.db, lambda s: s.add(row))
        return SdkSession(owner.id, name, row.created_at, {})

    async def session(self, session_id: str) -> SdkSession | None:
        row = await in_transaction(self.db, lambda s: s.get(CompatSessionRow, session_id))
        if row is None or row.protocol != self.protocol:
            return None
        return SdkSession(
            row.owner_key_id,
            row.name,
            row.created_at,
            {int(seq): model for seq, model in row.models.items()},
        )

    async def add_session_model(self, session_id: str, model_seq_id: int, model_id: str) -> None:
        def add(session: Session) -> None:
            row = session.get(CompatSessionRow, session_id, with_for_update=True)
            if row is not None:
                row.models = {**row.models, str(model_seq_id): model_id}

        await in_transaction(self.db, add)

    async def session_ids(self, viewer: KeyIdentity) -> list[str]:
        """The sessions `viewer` sees (an admin: all), newest first."""
        query = (
            select(CompatSessionRow.id)
            .where(CompatSessionRow.protocol == self.protocol)
            .order_by(CompatSessionRow.created_at.desc())
        )
        if not viewer.admin:
            query = query.where(CompatSessionRow.owner_key_id == viewer.id)
        return list(await in_transaction(self.db, lambda s: s.scalars(query).all()))

    # --- sampling sessions ----------------------------------------------------------------

    async def add_sampler(self, sampler_id: str, ref: SamplerRef) -> None:
        assert ref.owner is not None  # a sampling session is its maker's
        row = CompatSamplerRow(
            id=sampler_id,
            protocol=self.protocol,
            owner_key_id=ref.owner,
            base_model=ref.base_model,
            job_id=ref.job_id,
            version=ref.version,
            model_path=ref.model_path,
            tokenizer_path=ref.tokenizer_path,
        )
        await in_transaction(self.db, lambda s: s.merge(row))  # a resent create replaces it

    async def sampler(self, sampler_id: str) -> SamplerRef | None:
        row = await in_transaction(self.db, lambda s: s.get(CompatSamplerRow, sampler_id))
        if row is None or row.protocol != self.protocol:
            return None
        return SamplerRef(
            row.owner_key_id,
            row.base_model,
            row.job_id,
            row.version,
            row.model_path,
            row.tokenizer_path,
            row.created_at,
        )

    async def drop_sampler(self, sampler_id: str) -> None:
        await in_transaction(
            self.db,
            lambda s: s.execute(delete(CompatSamplerRow).where(CompatSamplerRow.id == sampler_id)),
        )

    async def sampler_ids(self, prefix: str) -> list[str]:
        query = select(CompatSamplerRow.id).where(
            CompatSamplerRow.protocol == self.protocol, CompatSamplerRow.id.startswith(prefix)
        )
        return list(await in_transaction(self.db, lambda s: s.scalars(query).all()))

    # --- named sampler weights ------------------------------------------------------------

    async def add_weights(self, path: str, ref: SamplerRef) -> None:
        assert ref.job_id is not None  # weights are a job's version
        row = CompatSamplerWeightsRow(
            path=path,
            owner_key_id=ref.owner,
            base_model=ref.base_model,
            job_id=ref.job_id,
            version=ref.version,
            saved_at=ref.saved_at,
            expires_at=ref.expires_at,
        )
        await in_transaction(self.db, lambda s: s.merge(row))

    async def live_weights(self, path_prefix: str) -> dict[str, SamplerRef]:
        """Named sampler weights under `path_prefix`, but those whose TTL ran out (which are
        forgotten here)."""

        def read(session: Session) -> dict[str, SamplerRef]:
            now = datetime.now(UTC)
            session.execute(
                delete(CompatSamplerWeightsRow).where(
                    CompatSamplerWeightsRow.path.startswith(path_prefix),
                    CompatSamplerWeightsRow.expires_at <= now,
                )
            )
            rows = session.scalars(
                select(CompatSamplerWeightsRow).where(
                    CompatSamplerWeightsRow.path.startswith(path_prefix)
                )
            )
            return {
                row.path: SamplerRef(
                    row.owner_key_id,
                    row.base_model,
                    row.job_id,
                    row.version,
                    saved_at=row.saved_at,
                    expires_at=row.expires_at,
                )
                for row in rows
            }

        return await in_transaction(self.db, read)

    async def weights(self, path: str) -> SamplerRef | None:
        return (await self.live_weights(path)).get(path)

    async def expire_weights(self, path: str, expires_at: datetime | None) -> bool:
        """Sets when named weights are forgotten; False: there are none at `path`."""
        if await self.weights(path) is None:  # none, or forgotten already
            return False

        def update(session: Session) -> bool:
            row = session.get(CompatSamplerWeightsRow, path)
            if row is None:
                return False
            row.expires_at = expires_at
            return True

        return await in_transaction(self.db, update)

    async def forget_weights(self, path: str) -> bool:
        """Forgets named weights; False: there were none at `path`."""

        def forget(session: Session) -> bool:
            row = session.get(CompatSamplerWeightsRow, path)
            if row is not None:
                session.delete(row)
            return row is not None

        return await in_transaction(self.db, forget)
