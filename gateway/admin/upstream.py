"""What the admin asks of modelstate and rollout: their typed clients over the gateway's pooled
upstream connections (one try each, a page's short timeout).

Reads for a page never raise: a service that is down or refuses becomes a message shown on the
page (`Fetched.error`), so one unreachable service cannot turn a page into an error. Actions
(move an alias, delete a version) raise the typed error the service answered with, so the route
can show e.g. modelstate's 409 for a pinned version next to the form.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import httpx2
from pydantic import TypeAdapter, ValidationError

from gateway.proxy.replicas import Replica
from gateway.proxy.upstreams import Upstreams
from modelstate.client import ARCHIVE, ModelStateClient
from modelstate.schemas import AliasName, Version
from services.common.errors import InvalidInput, LoomError
from services.rollout.client import RolloutClient
from services.rollout.schemas import LoadedVersion

T = TypeVar("T")

# A page waits this long at most for a service; the proxy's own timeouts are for long sampling.
PAGE_TIMEOUT = httpx2.Timeout(10.0, connect=3.0)
_ALIAS_NAME: TypeAdapter[str] = TypeAdapter(AliasName)


@dataclass
class Fetched(Generic[T]):
    value: T | None = None
    error: str | None = None


@dataclass
class ReplicaView:
    """What one rollout replica serves, as far as one job's viewer may know."""

    id: str
    url: str
    base_model: str | None = None
    full: LoadedVersion | None = None
    job_loras: list[int] = field(default_factory=list)
    other_loras: int = 0  # other jobs' adapters: counted, not named (they may not be ours)
    error: str | None = None


def _modelstate(upstreams: Upstreams) -> ModelStateClient:
    return ModelStateClient(upstreams.client("modelstate"), timeout=PAGE_TIMEOUT, retries=0)


async def job_versions(upstreams: Upstreams, job_id: str) -> Fetched[list[Version]]:
    try:
        versions = await _modelstate(upstreams).list_versions(job_id)
    except LoomError as exc:
        return Fetched(error=exc.message)
    except (ValueError, ValidationError) as exc:
        return Fetched(error=f"modelstate answered something unexpected: {exc}")
    return Fetched(value=sorted(versions, key=lambda v: v.number, reverse=True))


async def move_alias(upstreams: Upstreams, job_id: str, name: str, number: int) -> None:
    try:  # checked here too: the name becomes part of modelstate's URL path
        name = _ALIAS_NAME.validate_python(name)
    except ValidationError as exc:
        raise InvalidInput(
            f"{name!r} is not an alias name: up to 64 letters, digits, '.', "
            "'_' or '-', starting with a letter or '_'."
        ) from exc
    await _modelstate(upstreams).move_alias(job_id, name, number)


async def delete_version(upstreams: Upstreams, job_id: str, number: int) -> None:
    await _modelstate(upstreams).delete_version(job_id, number)


async def open_archive(upstreams: Upstreams, job_id: str, number: int) -> httpx2.Response:
    """modelstate's tar of a version, opened as a stream: the caller closes it."""
    return await _modelstate(upstreams).open(ARCHIVE, job_id=job_id, ref=number)


async def rollout_replicas(upstreams: Upstreams, job_id: str) -> list[ReplicaView]:
    """Each rollout replica the gateway routes to (`ReplicaRegistry.table`) and the versions
    of `job_id` it has loaded, asked of the replica itself, all at once."""
    return list(
        await asyncio.gather(
            *(_replica_view(replica, job_id) for replica in upstreams.replicas.table())
        )
    )


async def _replica_view(replica: Replica, job_id: str) -> ReplicaView:
    view = ReplicaView(id=replica.id, url=replica.url)
    try:
        resident = await RolloutClient(
            replica.client, timeout=PAGE_TIMEOUT, retries=0
        ).resident_versions()
    except LoomError as exc:
        view.error = exc.message
        return view
    except (ValueError, ValidationError) as exc:
        view.error = f"rollout answered something unexpected: {exc}"
        return view
    view.base_model = resident.base_model
    if resident.full is not None and resident.full.job_id == job_id:
        view.full = resident.full
    view.job_loras = sorted(v.number for v in resident.loras if v.job_id == job_id)
    view.other_loras = sum(1 for v in resident.loras if v.job_id != job_id)
    return view
