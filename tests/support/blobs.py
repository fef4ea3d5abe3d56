"""Feeding bytes into a blob store the way the upload route does, for tests."""

from __future__ import annotations

from modelstate.blobstore import BlobStore, ReceivedBlob


def receive(blobs: BlobStore, data: bytes, *, expected_sha256: str | None = None) -> ReceivedBlob:
    writer = blobs.writer("test")
    try:
        writer.write(data)
        return writer.finish(expected_sha256)
    except BaseException:
        writer.abort()
        raise
