"""Gateway logic that needs nothing running: the job state machine, key handling, headers."""

from __future__ import annotations

import pytest

from gateway.auth.dialects import ClientDialects
from gateway.auth.keys import DISPLAY_CHARS, KeyIdentity, generate_secret, hash_secret
from gateway.auth.middleware import AuthCache, is_public, presented_secret
from gateway.compat.tinker import routes as tinker_routes
from gateway.compat.weaver import errors as weaver_errors
from gateway.jobs.states import TRANSITIONS, move_job
from gateway.models import JobRow
from gateway.proxy.forward import NOT_FORWARDED, NOT_RETURNED, forwarded_headers
from gateway.schemas import JobStatus
from services.common.errors import InvalidTransition


def job(status: JobStatus) -> JobRow:
    return JobRow(id="job_1", status=status.value)


@pytest.mark.parametrize(
    ("start", "target"), [(start, target) for start in JobStatus for target in JobStatus]
)
def test_job_moves_follow_the_table(start: JobStatus, target: JobStatus) -> None:
    row = job(start)
    if target in TRANSITIONS[start]:
        move_job(row, target)
        assert row.status == target.value
    else:
        with pytest.raises(InvalidTransition, match=f"cannot become {target.value}"):
            move_job(row, target)
        assert row.status == start.value


def test_final_states_are_final() -> None:
    final = (JobStatus.completed, JobStatus.failed, JobStatus.cancelled)
    assert all(TRANSITIONS[status] == frozenset() for status in final)


def test_a_paused_job_resumes_or_stops() -> None:
    row = job(JobStatus.running)
    for target in (JobStatus.paused, JobStatus.running, JobStatus.paused, JobStatus.cancelled):
        move_job(row, target)
    assert row.status == "cancelled"


def test_secrets_are_random_prefixed_and_hashed() -> None:
    first, second = generate_secret(), generate_secret()
    assert first != second and first.startswith("loom_") and len(first) > 40
    assert hash_secret(first) == hash_secret(first) != hash_secret(second)
    assert len(hash_secret(first)) == 64 and first not in hash_secret(first)
    assert len(first) // 2 > DISPLAY_CHARS  # the displayed prefix gives little away


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({b"authorization": b"Bearer loom_a"}, "loom_a"),
        ({b"authorization": b"bearer   loom_a "}, "loom_a"),
        ({b"x-api-key": b"loom_b"}, "loom_b"),
        ({b"authorization": b"Bearer loom_a", b"x-api-key": b"loom_b"}, "loom_a"),
        # the SDKs' own ways, registered by their layers: Weaver's header, Tinker's prefix
        ({b"x-weaver-api-key": b"loom_w"}, "loom_w"),
        ({b"x-api-key": b"tml-loom_t"}, "loom_t"),
        ({b"authorization": b"Basic dXNlcg=="}, None),
        ({b"authorization": b"Bearer "}, None),
        ({}, None),
    ],
)
def test_presented_secret(headers: dict[bytes, bytes], expected: str | None) -> None:
    dialects = ClientDialects()
    dialects.register(tinker_routes.DIALECT)
    dialects.register(weaver_errors.DIALECT)
    assert presented_secret(headers, dialects) == expected


def test_public_paths() -> None:
    for path in (
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/docs",
        "/docs/oauth2-redirect",
    ):
        assert is_public(path)
    for path in ("/v1/jobs", "/v1/health", "/metricsx", "/v1/rollout/docs"):
        assert not is_public(path)


def test_forwarded_headers_drop_hop_by_hop_and_credentials() -> None:
    raw = [
        (b"Host", b"gw"),
        (b"Authorization", b"Bearer k"),
        (b"X-API-Key", b"k"),
        (b"Connection", b"keep-alive, X-Hop"),
        (b"X-Hop", b"1"),
        (b"TE", b"trailers"),
        (b"Content-Type", b"application/json"),
        (b"X-Custom", b"a"),
        (b"X-Custom", b"b"),
    ]
    assert forwarded_headers(raw, NOT_FORWARDED) == [
        (b"Content-Type", b"application/json"),
        (b"X-Custom", b"a"),
        (b"X-Custom", b"b"),
    ]
    returned = [
        (b"transfer-encoding", b"chunked"),
        (b"x-request-id", b"r"),
        (b"set-cookie", b"a=1"),
        (b"set-cookie", b"b=2"),
    ]
    assert forwarded_headers(returned, NOT_RETURNED) == [
        (b"set-cookie", b"a=1"),
        (b"set-cookie", b"b=2"),
    ]


def test_auth_cache_expires_and_evicts() -> None:
    now = [100.0]
    cache = AuthCache(ttl_s=10, clock=lambda: now[0])
    alice = KeyIdentity(id="key_a", name="alice", admin=False)
    cache.put("h1", alice)
    assert cache.get("h1") == alice and cache.get("h2") is None
    now[0] += 11
    assert cache.get("h1") is None
    cache.put("h1", alice)
    cache.evict("key_a")
    assert cache.get("h1") is None


def test_a_full_auth_cache_drops_the_least_recently_used_key() -> None:
    cache = AuthCache(ttl_s=10, max_entries=2)
    keys = [KeyIdentity(id=f"key_{i}", name=str(i), admin=False) for i in range(3)]
    cache.put("h0", keys[0])
    cache.put("h1", keys[1])
    assert cache.get("h0") == keys[0]  # h1 is now the least recently used
    cache.put("h2", keys[2])
    assert (cache.get("h0"), cache.get("h1"), cache.get("h2")) == (keys[0], None, keys[2])


def test_disabled_auth_cache_keeps_nothing() -> None:
    cache = AuthCache(ttl_s=0)
    cache.put("h1", KeyIdentity(id="key_a", name="alice", admin=False))
    assert cache.get("h1") is None
