"""Which rollout replica serves a request: a pure policy over the registry's candidates.

In order of precedence:
1. **Stickiness.** A request with an affinity key (a captured trajectory's id, or the
   `X-Loom-Affinity` header a script sets for an episode's turns) goes to the replica that key
   hashes to among the candidates (rendezvous hashing: the same replica while it lives, and only
   the keys of a replica that leaves move), so its prefix stays in one engine's cache.
2. **Version affinity.** Replicas already holding the version asked for come first: no swap,
   no download. `latest` means the newest version of the job any replica holds.
3. **Least outstanding work**, then a rotating turn among equals.

The rest follow as fallbacks, tried in order when a replica cannot be reached. `latest` right
after a publish is never answered by an older version whatever replica is picked: every
replica resolves `latest` with the store at the request (`Versions.resolve`) and loads what it
lacks before it samples; the preference here only saves that load.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.proxy.replicas import Replica, VersionHeld
from services.rollout.openai.schemas import BASE_ALIAS, job_model

AFFINITY_HEADER = "X-Loom-Affinity"
LATEST = "latest"
# POST paths (after /v1/rollout) whose body names the version that serves them.
VERSIONED_POSTS = frozenset(
    {("sample",), ("sample", "batch"), ("rollouts",), ("completions",), ("chat", "completions")}
)
TRAJECTORIES = "trajectories"


@dataclass(frozen=True)
class RouteKey:
    job_id: str | None = None
    version: int | str = LATEST
    affinity: str | None = None

    def wanted(self, newest: Callable[[str], int]) -> VersionHeld | None:
        """The (job, number) a replica must hold to serve this without loading anything;
        None when it cannot be told here (an alias other than `latest`)."""
        version = self.version
        if isinstance(version, str) and version.isdigit():
            version = int(version)
        if self.job_id is None:
            return (None, 0) if version in (0, LATEST) else None
        if version == LATEST:
            version = newest(self.job_id)
        if not isinstance(version, int):
            return None
        return (self.job_id, version) if version > 0 else (None, 0)


def reads_body(method: str, segments: tuple[str, ...]) -> bool:
    """Whether routing this call needs its body (the version it asks for)."""
    return method == "POST" and segments in VERSIONED_POSTS


def route_key(segments: tuple[str, ...], body: bytes | None, affinity: str | None) -> RouteKey:
    """What routing reads of a call: its path (a trajectory's calls stick to its id), its body
    (job and version, or an OpenAI `model`) and the affinity header."""
    if len(segments) >= 2 and segments[0] == TRAJECTORIES:  # the trajectory decides its version
        return RouteKey(affinity=segments[1])
    fields = _json_object(body)
    job_id, version = fields.get("job_id"), fields.get("version", LATEST)
    model = fields.get("model")
    if isinstance(model, str):
        parsed = job_model(model) if model != BASE_ALIAS else None
        job_id, version = (parsed[0], parsed[1] or LATEST) if parsed else (None, 0)
    return RouteKey(
        job_id=job_id if isinstance(job_id, str) else None,
        version=version if isinstance(version, int | str) else LATEST,
        affinity=affinity or None,
    )


def order(
    candidates: Sequence[Replica], key: RouteKey, newest: Callable[[str], int], turn: int
) -> list[Replica]:
    """`candidates`, best first."""
    count = len(candidates)
    wanted = key.wanted(newest) if count > 1 else None

    def rank(indexed: tuple[int, Replica]) -> tuple[bool, int, int]:
        index, replica = indexed
        lacks = wanted is not None and not replica.holds(wanted)
        return lacks, replica.load, (index - turn) % count

    ranked = [replica for _, replica in sorted(enumerate(candidates), key=rank)]
    if key.affinity is not None and count > 1:
        sticky = max(candidates, key=lambda replica: _weight(key.affinity or "", replica.id))
        ranked.remove(sticky)
        ranked.insert(0, sticky)
    return ranked


def _weight(affinity: str, replica_id: str) -> bytes:
    return hashlib.blake2b(f"{affinity}\0{replica_id}".encode(), digest_size=8).digest()


def _json_object(body: bytes | None) -> dict[str, object]:
    """The body's top-level fields; nothing when it is not a JSON object (the replica answers
    that with its own 4xx)."""
    if not body:
        return {}
    try:
        parsed = json.loads(body)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
