"""HTTP routes of the model-state store: parse, call the store, return."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, File, Form, Path, UploadFile
from fastapi.responses import FileResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from modelstate.deps import StoreDep
from modelstate.events import EventsDep
from modelstate.schemas import Alias, MoveAlias, PublishRequest, Version, VersionList
from services.common.errors import InvalidInput

ALIAS_PATTERN = r"^[A-Za-z_][A-Za-z0-9._-]*$"

router = APIRouter(prefix="/v1", tags=["versions"])


def parse_publish_meta(raw: str) -> PublishRequest:
    try:
        return PublishRequest.model_validate_json(raw)
    except ValidationError as exc:
        errors = json.loads(exc.json(include_url=False))
        summary = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'meta'}: {e['msg']}" for e in errors[:5]
        )
        raise InvalidInput(f"Invalid `meta` part: {summary}", errors) from exc


@router.post("/versions", status_code=201, response_model=Version)
async def publish_version(
    store: StoreDep,
    broadcaster: EventsDep,
    meta: Annotated[str, Form(description="PublishRequest as a JSON string.")],
    files: Annotated[list[UploadFile], File(description="One part per file; filename = path.")],
) -> Version:
    request = parse_publish_meta(meta)
    uploads = [(upload.filename or "", upload.file) for upload in files]
    version = await run_in_threadpool(store.publish, request, uploads)
    broadcaster.announce(version)
    return version


@router.get("/jobs/{job_id}/versions", response_model=VersionList)
async def list_versions(store: StoreDep, job_id: str) -> VersionList:
    return VersionList(versions=await run_in_threadpool(store.list_versions, job_id))


@router.get("/jobs/{job_id}/versions/{ref}", response_model=Version)
async def get_version(store: StoreDep, job_id: str, ref: str) -> Version:
    return await run_in_threadpool(store.get_version, job_id, ref)


@router.get(
    "/jobs/{job_id}/versions/{ref}/files/{path:path}",
    response_class=FileResponse,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
async def get_file(store: StoreDep, job_id: str, ref: str, path: str) -> FileResponse:
    blob = await run_in_threadpool(store.open_file, job_id, ref, path)
    return FileResponse(blob, media_type="application/octet-stream")


@router.put("/jobs/{job_id}/aliases/{name}", response_model=Alias)
async def move_alias(
    store: StoreDep,
    job_id: str,
    name: Annotated[str, Path(min_length=1, max_length=64, pattern=ALIAS_PATTERN)],
    body: MoveAlias,
) -> Alias:
    return await run_in_threadpool(store.move_alias, job_id, name, body.number)
