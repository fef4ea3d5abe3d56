"""Request bodies read with a size limit: the proxy's calls and the SDK protocols."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request

from gateway.auth.keys import KeyIdentity
from gateway.settings import GatewaySettings
from services.common.errors import PayloadTooLarge


@dataclass(frozen=True)
class BodyLimits:
    """The largest body the proxy forwards, per key class: a job key's calls carry training
    data at most; an admin's may carry weights."""

    job_key_bytes: int
    admin_key_bytes: int

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> BodyLimits:
        return cls(settings.gateway_max_body_mb << 20, settings.gateway_admin_max_body_mb << 20)

    def for_key(self, key: KeyIdentity) -> int:
        return self.admin_key_bytes if key.admin else self.job_key_bytes


def body_too_large(limit: int, hint: str = "") -> PayloadTooLarge:
    return PayloadTooLarge(
        f"Request bodies of this endpoint are limited to {limit >> 20} MiB{hint}.",
        {"limit_bytes": limit},
    )


async def capped_stream(request: Request, limit: int, hint: str = "") -> AsyncIterator[bytes]:
    """The body as it arrives, refused with a 413 as soon as it passes `limit` (a chunked body
    declares no length up front)."""
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit, hint)
        yield chunk


async def read_capped(request: Request, limit: int, hint: str = "") -> bytes:
    """The whole body, or a 413 as soon as it passes `limit` (never all of it in memory)."""
    return b"".join([chunk async for chunk in capped_stream(request, limit, hint)])
