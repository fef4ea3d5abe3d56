"""The rollout replicas the gateway routes to.

Each replica announces itself with a heartbeat (`PUT /v1/internal/replicas/{id}`, service
token): its URL, readiness, the versions its engine holds and its load. A replica silent for
`missed_heartbeats` of its own intervals leaves the table, and its next heartbeat adds it back.
A replica the gateway could not connect to is set aside until it beats again.

The configured `LOOM_ROLLOUT_URL` is one static replica: it serves while no registered replica
is live (the embedded default and compose before the replica's first heartbeat, or a rollout
too old to announce itself), and is the registered replica of the same URL once that one beats.

Replicas about to fetch a version's files claim it here first (`claim`), in the order they ask:
each is pointed at the one that claimed just before, so replicas a publish reaches at once
form a chain from the store instead of each fetching from the store.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx2

from services.rollout.schemas import LoadedVersion, ReplicaHeartbeat, ReplicaPublic

STATIC_ID = "static"
VersionHeld = tuple[str | None, int]  # (job id, number); (None, 0) is the base model
# Versions whose claimants are remembered: a chain matters while a publish spreads, minutes.
CLAIMED_VERSIONS = 256


@dataclass
class Replica:
    id: str
    url: str
    client: httpx2.AsyncClient
    static: bool = False
    ready: bool = True
    versions: frozenset[VersionHeld] = frozenset()
    requests_in_flight: int = 0  # as the replica last reported
    tokens_in_flight: int = 0
    heartbeat_s: float = 0.0
    seen_at: float | None = None  # monotonic time of the last heartbeat
    set_aside: bool = False  # a connection to it failed since its last heartbeat
    in_flight: int = 0  # this gateway's requests open on it
    routed: int = 0
    failures: int = 0
    reported: list[LoadedVersion] = field(default_factory=list)

    def holds(self, version: VersionHeld) -> bool:
        return version in self.versions

    @property
    def load(self) -> int:
        """Outstanding requests: this gateway's own count moves at once, the replica's report
        also counts other callers (another gateway, the worker)."""
        return max(self.in_flight, self.requests_in_flight)

    def public(self, now: float) -> ReplicaPublic:
        return ReplicaPublic(
            id=self.id,
            url=self.url,
            static=self.static,
            ready=self.ready,
            set_aside=self.set_aside,
            versions=self.reported,
            requests_in_flight=self.requests_in_flight,
            tokens_in_flight=self.tokens_in_flight,
            gateway_in_flight=self.in_flight,
            routed=self.routed,
            failures=self.failures,
            heartbeat_s=self.heartbeat_s,
            last_heartbeat_s_ago=None if self.seen_at is None else round(now - self.seen_at, 3),
        )


class ReplicaRegistry:
    def __init__(
        self,
        static_url: str | None,
        make_client: Callable[[str], httpx2.AsyncClient],
        *,
        missed_heartbeats: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.make_client = make_client
        self.missed_heartbeats = missed_heartbeats
        self.clock = clock
        self._clients: dict[str, httpx2.AsyncClient] = {}  # by URL: reused when one returns
        self._registered: dict[str, Replica] = {}
        self._turns = 0
        self._claims: OrderedDict[VersionHeld, list[str]] = OrderedDict()  # replica ids
        self.static = (
            None
            if static_url is None
            else Replica(
                id=STATIC_ID,
                url=static_url.rstrip("/"),
                client=self._client(static_url),
                static=True,
            )
        )

    def _client(self, url: str) -> httpx2.AsyncClient:
        url = url.rstrip("/")
        if url not in self._clients:
            self._clients[url] = self.make_client(url)
        return self._clients[url]

    # --- membership -----------------------------------------------------------------------

    def heartbeat(self, replica_id: str, beat: ReplicaHeartbeat) -> Replica:
        """Add or refresh a replica (a heartbeat is its registration)."""
        url = beat.url.rstrip("/")
        replica = self._registered.get(replica_id)
        if replica is None or replica.url != url:
            replica = self._registered[replica_id] = Replica(
                id=replica_id, url=url, client=self._client(url)
            )
        replica.ready = beat.ready
        replica.reported = beat.versions
        # Version 0 of any job is the base model.
        replica.versions = frozenset(
            (v.job_id if v.number else None, v.number) for v in beat.versions
        )
        replica.requests_in_flight = beat.requests_in_flight
        replica.tokens_in_flight = beat.tokens_in_flight
        replica.heartbeat_s = beat.heartbeat_s
        replica.seen_at = self.clock()
        replica.set_aside = False
        return replica

    def leave(self, replica_id: str) -> bool:
        """A replica going away on purpose (scaled down): no new request goes to it."""
        return self._registered.pop(replica_id, None) is not None

    def claim(self, replica_id: str, version: VersionHeld) -> list[str] | None:
        """`replica_id` is about to fetch `version`'s files: the URLs of the replicas to fetch
        them from, best first (None: no such replica is registered). The replica that claimed
        it just before comes first, then earlier claimants, newest first, then other replicas
        that report it resident, least loaded first. Each replica thus feeds one other (a
        chain: every one uploads the files once, and the last one is served about when the
        first is, as each serves a file while it arrives); when one dies its downstream
        falls back to the one before it. A replica claiming again (its fetch failed) moves to
        the chain's end."""
        live = {r.id: r for r in self.live()}
        if replica_id not in live:
            return None
        earlier = [c for c in self._claims.pop(version, []) if c in live and c != replica_id]
        self._claims[version] = [*earlier, replica_id]
        while len(self._claims) > CLAIMED_VERSIONS:
            self._claims.popitem(last=False)
        chain = [live[c] for c in reversed(earlier) if not live[c].set_aside]
        holders = sorted(
            (
                r
                for r in live.values()
                if r.id != replica_id
                and r.ready
                and not r.set_aside
                and r.holds(version)
                and r.id not in earlier
            ),
            key=lambda r: r.load,
        )
        return [r.url for r in (*chain, *holders)]

    def set_aside(self, replica: Replica) -> None:
        """A connection to `replica` failed: route around it until it beats again. The static
        replica stays: with no registered one, it is all there is."""
        replica.failures += 1
        if not replica.static:
            replica.set_aside = True

    def live(self) -> list[Replica]:
        """Registered replicas heard from within their heartbeat allowance; the others are
        dropped."""
        now = self.clock()
        expired = [
            r.id
            for r in self._registered.values()
            if r.seen_at is None or now - r.seen_at > self.missed_heartbeats * r.heartbeat_s
        ]
        for replica_id in expired:
            del self._registered[replica_id]
        return list(self._registered.values())

    def candidates(self) -> list[Replica]:
        """Where a request may go: live ready replicas; else live ones still starting (their
        own 503 says why); else the static replica."""
        live = [r for r in self.live() if not r.set_aside]
        ready = [r for r in live if r.ready]
        if ready or live:
            return ready or live
        return [self.static] if self.static is not None else []

    def next_turn(self) -> int:
        """A counter that rotates the pick among equally good replicas."""
        self._turns += 1
        return self._turns

    def newest(self, job_id: str) -> int:
        """The newest version of `job_id` any live replica holds (0: none)."""
        return max(
            (number for r in self.live() for job, number in r.versions if job == job_id), default=0
        )

    def table(self) -> list[Replica]:
        """The routing table: the live replicas, or the static one while there are none."""
        return self.live() or ([self.static] if self.static is not None else [])

    def public(self) -> list[ReplicaPublic]:
        now = self.clock()
        return [r.public(now) for r in self.table()]

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()
