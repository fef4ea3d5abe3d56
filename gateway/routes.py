"""The gateway's own API: jobs, API keys, the stack's health. Routes parse, call, return."""

from __future__ import annotations

from fastapi import APIRouter, Request, status

from gateway import jobs, keys
from gateway.deps import (
    AdminKey,
    AuthCacheDep,
    CurrentKey,
    SessionDep,
    SessionsDep,
    TrainerDep,
    UpstreamsDep,
)
from gateway.schemas import (
    ApiKeyCreate,
    ApiKeyCreated,
    ApiKeyList,
    ApiKeyPublic,
    Job,
    JobCreate,
    JobList,
    JobStatusUpdate,
    StackHealth,
)
from services.common.schemas import Health

router = APIRouter(prefix="/v1")


@router.post("/jobs", response_model=Job, status_code=status.HTTP_201_CREATED, tags=["jobs"])
async def create_job(body: JobCreate, key: CurrentKey, sessions: SessionsDep,
                     trainer: TrainerDep) -> Job:
    return await jobs.create_job(sessions, trainer, body, key)


@router.get("/jobs", response_model=JobList, tags=["jobs"])
def list_jobs(key: CurrentKey, session: SessionDep) -> JobList:
    return JobList(jobs=jobs.list_jobs(session, key))


@router.get("/jobs/{job_id}", response_model=Job, tags=["jobs"])
def get_job(job_id: str, key: CurrentKey, session: SessionDep) -> Job:
    return jobs.to_public(jobs.get_job_row(session, job_id, key))


@router.post("/jobs/{job_id}/status", response_model=Job, tags=["jobs"])
def set_job_status(job_id: str, body: JobStatusUpdate, key: CurrentKey,
                   session: SessionDep) -> Job:
    return jobs.set_status(session, job_id, body.status, key)


@router.post("/keys", response_model=ApiKeyCreated, status_code=status.HTTP_201_CREATED,
             tags=["keys"])
def create_key(body: ApiKeyCreate, _admin: AdminKey, session: SessionDep) -> ApiKeyCreated:
    return keys.create_key(session, body.name, body.admin)


@router.get("/keys", response_model=ApiKeyList, tags=["keys"])
def list_keys(_admin: AdminKey, session: SessionDep) -> ApiKeyList:
    return ApiKeyList(keys=keys.list_keys(session))


@router.delete("/keys/{key_id}", response_model=ApiKeyPublic, tags=["keys"])
def revoke_key(key_id: str, _admin: AdminKey, session: SessionDep,
               cache: AuthCacheDep) -> ApiKeyPublic:
    revoked = keys.revoke_key(session, key_id)
    cache.evict(key_id)
    return revoked


@router.get("/health", response_model=StackHealth, tags=["ops"])
async def stack_health(request: Request, _key: CurrentKey, upstreams: UpstreamsDep
                       ) -> StackHealth:
    gateway = Health(service="gateway", status="ready", version=request.app.version)
    return await upstreams.health(gateway)
