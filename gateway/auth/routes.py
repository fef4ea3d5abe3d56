"""API keys: created, listed and revoked by an admin. Routes parse, call, return."""

from __future__ import annotations

from fastapi import APIRouter, status

from gateway.auth import keys
from gateway.auth.deps import AdminKey
from gateway.deps import AuthCacheDep, SessionDep
from gateway.schemas import ApiKeyCreate, ApiKeyCreated, ApiKeyList, ApiKeyPublic

router = APIRouter(prefix="/v1")


@router.post(
    "/keys", response_model=ApiKeyCreated, status_code=status.HTTP_201_CREATED, tags=["keys"]
)
def create_key(body: ApiKeyCreate, _admin: AdminKey, session: SessionDep) -> ApiKeyCreated:
    return keys.create_key(session, body.name, body.admin)


@router.get("/keys", response_model=ApiKeyList, tags=["keys"])
def list_keys(_admin: AdminKey, session: SessionDep) -> ApiKeyList:
    return ApiKeyList(keys=keys.list_keys(session))


@router.delete("/keys/{key_id}", response_model=ApiKeyPublic, tags=["keys"])
def revoke_key(
    key_id: str, _admin: AdminKey, session: SessionDep, cache: AuthCacheDep
) -> ApiKeyPublic:
    revoked = keys.revoke_key(session, key_id)
    cache.evict(key_id)
    return revoked
