"""Versions: publish, read, compare, download, delete; aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Path, Query, Response, status
from fastapi.responses import FileResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from modelstate import export
from modelstate.deps import CollectorDep, SettingsDep, StoreDep
from modelstate.events import EventsDep
from modelstate.manifests import diff_versions
from modelstate.schemas import (
    Alias,
    Lineage,
    ManifestDiff,
    MoveAlias,
    PublishRequest,
    Version,
    VersionList,
)

ALIAS_PATTERN = r"^[A-Za-z_][A-Za-z0-9._-]*$"
AliasPath = Annotated[str, Path(min_length=1, max_length=64, pattern=ALIAS_PATTERN)]

router = APIRouter(prefix="/v1", tags=["versions"])


@router.post(
    "/versions",
    status_code=status.HTTP_201_CREATED,
    response_model=Version,
    responses={
        200: {"model": Version, "description": "The step was published before with these files."}
    },
)
async def publish_version(
    store: StoreDep,
    collector: CollectorDep,
    broadcaster: EventsDep,
    body: PublishRequest,
    response: Response,
    background: BackgroundTasks,
) -> Version:
    pending = await run_in_threadpool(store.link_pending, body)
    if pending is not None:
        broadcaster.announce(pending)
    version, created = await run_in_threadpool(store.publish, body)
    if created:
        broadcaster.announce(version)
        background.add_task(run_in_threadpool, collector.apply_retention, body.job_id)
    else:
        response.status_code = status.HTTP_200_OK
    return version


@router.get("/jobs/{job_id}/versions", response_model=VersionList)
async def list_versions(store: StoreDep, job_id: str) -> VersionList:
    return VersionList(versions=await run_in_threadpool(store.list_versions, job_id))


@router.get("/jobs/{job_id}/versions/{ref}", response_model=Version)
async def get_version(store: StoreDep, job_id: str, ref: str) -> Version:
    return await run_in_threadpool(store.get_version, job_id, ref)


@router.delete("/jobs/{job_id}/versions/{number}", response_model=Version)
async def delete_version(
    store: StoreDep, job_id: str, number: Annotated[int, Path(ge=1)]
) -> Version:
    """409 while an alias points at it or a serving engine pins it."""
    return await run_in_threadpool(store.delete_version, job_id, number)


@router.get("/jobs/{job_id}/versions/{ref}/lineage", response_model=Lineage)
async def lineage(store: StoreDep, job_id: str, ref: str) -> Lineage:
    versions, complete = await run_in_threadpool(store.lineage, job_id, ref)
    return Lineage(versions=versions, complete=complete)


@router.get("/jobs/{job_id}/compare", response_model=ManifestDiff)
async def compare(store: StoreDep, job_id: str, a: str, b: str) -> ManifestDiff:
    first = await run_in_threadpool(store.get_version, job_id, a)
    second = await run_in_threadpool(store.get_version, job_id, b)
    return diff_versions(first, second)


@router.get(
    "/jobs/{job_id}/versions/{ref}/files/{path:path}",
    response_class=FileResponse,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
async def get_file(store: StoreDep, job_id: str, ref: str, path: str) -> FileResponse:
    """Range requests are honoured, so an interrupted download resumes."""
    blob = await run_in_threadpool(store.open_file, job_id, ref, path)
    return FileResponse(blob, media_type="application/octet-stream")


@router.get(
    "/jobs/{job_id}/versions/{ref}/archive",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-tar": {}}}},
)
async def archive(
    store: StoreDep,
    settings: SettingsDep,
    job_id: str,
    ref: str,
    merge_lora: Annotated[
        bool,
        Query(
            description="A LoRA version merged into its base: a full Hugging Face model directory."
        ),
    ] = False,
) -> StreamingResponse:
    version = await run_in_threadpool(store.get_version, job_id, ref)
    if merge_lora:
        files = await run_in_threadpool(export.merged_lora, store.blobs, version, settings.data_dir)
    else:
        files = export.version_files(store.blobs, version)
    root = f"{job_id}-v{version.number}" + ("-merged" if merge_lora else "")
    return StreamingResponse(
        export.tar_stream(files, root),
        media_type="application/x-tar",
        headers={"Content-Disposition": f'attachment; filename="{root}.tar"'},
    )


@router.put("/jobs/{job_id}/aliases/{name}", response_model=Alias)
async def move_alias(store: StoreDep, job_id: str, name: AliasPath, body: MoveAlias) -> Alias:
    return await run_in_threadpool(store.move_alias, job_id, name, body.number)


@router.delete("/jobs/{job_id}/aliases/{name}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_alias(store: StoreDep, job_id: str, name: AliasPath) -> None:
    await run_in_threadpool(store.delete_alias, job_id, name)
