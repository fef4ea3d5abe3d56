"""Streaming a blob upload from an HTTP request body to disk: chunks are gathered to
`CHUNK_BYTES`, then written and hashed off the event loop, so a shard of any size takes
constant memory and never stalls other requests."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from modelstate.blobstore import CHUNK_BYTES, BlobStore, ReceivedBlob
from services.common.errors import InvalidInput


async def receive_blob(
    blobs: BlobStore, body: AsyncIterator[bytes], *, sha256: str, size: int | None
) -> ReceivedBlob:
    writer = await run_in_threadpool(blobs.writer, sha256)
    buffer = bytearray()
    try:
        async for chunk in body:
            buffer += chunk
            if len(buffer) >= CHUNK_BYTES:
                data = bytes(buffer)
                buffer.clear()
                await run_in_threadpool(writer.write, data)
        await run_in_threadpool(writer.write, bytes(buffer))
        return await run_in_threadpool(writer.finish, sha256, size)
    except ClientDisconnect as exc:
        writer.abort()
        raise InvalidInput(
            f"The upload of {sha256} was cut off after {writer.size} bytes; nothing was stored."
        ) from exc
    except BaseException:
        writer.abort()
        raise
