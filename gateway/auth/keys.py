"""API keys: random secrets (`loom_...`) stored only as sha256 hashes.

Data functions take a session and only flush; the caller owns the transaction.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gateway.models import ApiKeyRow, utcnow
from gateway.schemas import ApiKeyCreated, ApiKeyPublic
from services.common.errors import NotFound

KEY_PREFIX = "loom_"
DISPLAY_CHARS = 12  # "loom_" plus a few characters: enough to tell keys apart in a list


@dataclass(frozen=True)
class KeyIdentity:
    """Who is calling: what the auth middleware attaches to an authenticated request."""

    id: str
    name: str
    admin: bool
    job_id: str | None = None  # a job key: it acts for this one job only (a managed run's)

    def sees_job(self, job_id: str, owner_key_id: str | None) -> bool:
        if self.job_id is not None:
            return job_id == self.job_id
        return self.admin or owner_key_id == self.id


def generate_secret() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def create_key(
    session: Session, name: str, admin: bool, secret: str | None = None
) -> ApiKeyCreated:
    secret = secret or generate_secret()
    row = ApiKeyRow(
        name=name, admin=admin, prefix=secret[:DISPLAY_CHARS], key_hash=hash_secret(secret)
    )
    session.add(row)
    session.flush()
    return ApiKeyCreated(**to_public(row).model_dump(), key=secret)


def authenticate(session: Session, secret: str) -> KeyIdentity | None:
    """The identity behind a presented secret, or None when it is unknown or revoked."""
    digest = hash_secret(secret)
    row = session.scalar(select(ApiKeyRow).where(ApiKeyRow.key_hash == digest))
    # The lookup is by hash; compare again in constant time so a match never hinges on the
    # database's own string comparison.
    if row is None or not hmac.compare_digest(row.key_hash, digest) or row.revoked_at:
        return None
    return _identity(row)


def active_identity(session: Session, key_id: str) -> KeyIdentity | None:
    """The identity of key `key_id` while it is not revoked (a web admin session names its key
    by id and asks this on every request, so revoking the key ends the session)."""
    row = session.get(ApiKeyRow, key_id)
    if row is None or row.revoked_at:
        return None
    return _identity(row)


def _identity(row: ApiKeyRow) -> KeyIdentity:
    return KeyIdentity(id=row.id, name=row.name, admin=row.admin, job_id=row.job_id)


def create_job_key(session: Session, job_id: str, name: str) -> str:
    """A new key acting for job `job_id` only (its owner's rights on that job, nothing else);
    the secret is returned once, as for every key."""
    secret = generate_secret()
    session.add(
        ApiKeyRow(
            name=name,
            admin=False,
            job_id=job_id,
            prefix=secret[:DISPLAY_CHARS],
            key_hash=hash_secret(secret),
        )
    )
    session.flush()
    return secret


def revoke_job_keys(session: Session, job_id: str, name: str) -> list[str]:
    """Revoke job `job_id`'s live keys called `name`; their ids (for `AuthCache.evict`)."""
    rows = list(
        session.scalars(
            select(ApiKeyRow).where(
                ApiKeyRow.job_id == job_id, ApiKeyRow.name == name, ApiKeyRow.revoked_at.is_(None)
            )
        )
    )
    for row in rows:
        row.revoked_at = utcnow()
    session.flush()
    return [row.id for row in rows]


def count_keys(session: Session) -> int:
    return int(session.scalar(select(func.count()).select_from(ApiKeyRow)) or 0)


def key_exists(session: Session, secret: str) -> bool:
    digest = hash_secret(secret)
    return session.scalar(select(ApiKeyRow.id).where(ApiKeyRow.key_hash == digest)) is not None


def list_keys(session: Session) -> list[ApiKeyPublic]:
    rows = session.scalars(select(ApiKeyRow).order_by(ApiKeyRow.created_at, ApiKeyRow.id))
    return [to_public(row) for row in rows]


def revoke_key(session: Session, key_id: str) -> ApiKeyPublic:
    row = session.get(ApiKeyRow, key_id)
    if row is None:
        raise NotFound(f"No API key {key_id!r}.")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        session.flush()
    return to_public(row)


def to_public(row: ApiKeyRow) -> ApiKeyPublic:
    return ApiKeyPublic(
        id=row.id,
        name=row.name,
        admin=row.admin,
        job_id=row.job_id,
        prefix=row.prefix,
        created_at=row.created_at,
        revoked_at=row.revoked_at,
    )
