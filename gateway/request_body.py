"""Request bodies read with a size limit: the proxy's scoped calls and the SDK protocols."""

from __future__ import annotations

from fastapi import Request

from services.common.errors import PayloadTooLarge


async def read_capped(request: Request, limit: int, hint: str = "") -> bytes:
    """The whole body, or a 413 as soon as it passes `limit` (never all of it in memory)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"Request bodies of this endpoint are limited to "
                                  f"{limit >> 20} MiB{hint}.")
        chunks.append(chunk)
    return b"".join(chunks)
