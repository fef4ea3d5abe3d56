"""Blob uploads: a publisher stores each file's content once (GET tells whether it is there
already), then commits a version that lists them (`POST /v1/versions`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Request, Response, status
from starlette.concurrency import run_in_threadpool

from modelstate.blobstore import MARKER_FILE
from modelstate.deps import StoreDep
from modelstate.schemas import StoredBlob, StoreInfo
from modelstate.uploads import receive_blob
from services.common.errors import NotFound, PayloadTooLarge

Sha256Path = Annotated[
    str, Path(pattern=r"^[0-9a-f]{64}$", description="Lowercase hex sha256 of the content.")
]

router = APIRouter(prefix="/v1", tags=["blobs"])


@router.get("/store", response_model=StoreInfo)
async def store_info(store: StoreDep) -> StoreInfo:
    blobs = store.blobs
    return StoreInfo(
        instance_id=blobs.instance_id,
        staging_dir=str(blobs.staging),
        marker_file=str(blobs.staging / MARKER_FILE),
        max_file_bytes=blobs.max_file_bytes,
    )


@router.get("/blobs/{sha256}", response_model=StoredBlob)
async def get_blob(store: StoreDep, sha256: Sha256Path) -> StoredBlob:
    return await run_in_threadpool(store.blob, sha256)


@router.put(
    "/blobs/{sha256}",
    response_model=StoredBlob,
    status_code=status.HTTP_201_CREATED,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
async def put_blob(
    store: StoreDep,
    request: Request,
    response: Response,
    sha256: Sha256Path,
    content_length: Annotated[int | None, Header(ge=0)] = None,
) -> StoredBlob:
    """The raw body is the content, streamed to disk and checked against `sha256` (and
    Content-Length, when sent). Content already stored is not read again (200)."""
    if content_length is not None and content_length > store.blobs.max_file_bytes:
        raise PayloadTooLarge(
            f"{content_length} bytes is over the limit of "
            f"{store.blobs.max_file_bytes} bytes per file."
        )
    try:
        existing = await run_in_threadpool(store.blob, sha256)
    except NotFound:
        received = await receive_blob(
            store.blobs, request.stream(), sha256=sha256, size=content_length
        )
        return await run_in_threadpool(store.register_blob, received)
    response.status_code = status.HTTP_200_OK
    return existing
