"""The proxy's canonical path: every spelling that could be read two ways is refused, and what
is accepted is exactly what the service's server decodes and the forwarding client sends."""

from __future__ import annotations

from urllib.parse import unquote

import httpx2
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gateway.proxy.target import proxy_target
from services.common.errors import BadRequest


def target_of(raw_path: str, query: str = "") -> str:
    return proxy_target(raw_path, 2, query).target


@pytest.mark.parametrize(
    "raw_path",
    [
        "/v1/modelstate/jobs/mine/../theirs/versions",
        "/v1/modelstate/jobs/mine/%2e%2e/theirs/versions",
        "/v1/modelstate/jobs/mine/%2E%2E/theirs/versions",
        "/v1/modelstate/jobs/mine/.%2E/theirs/versions",
        "/v1/modelstate/jobs/mine/./versions",
        "/v1/modelstate/jobs/mine/%2e/versions",
        "/v1/modelstate/jobs/mine%2F..%2Ftheirs/versions",
        "/v1/modelstate/jobs/mine%2f..%2ftheirs/versions",
        "/v1/modelstate/jobs/mine%5C..%5Ctheirs/versions",
        "/v1/modelstate/jobs//theirs/versions",
        "/v1/modelstate/jobs/mine/versions/",
        "/v1/modelstate/jobs/mine/%00/versions",
        "/v1/modelstate/jobs/mine/%ff/versions",
        "/v1/modelstate/jobs/mine/versions/..",
    ],
)
def test_ambiguous_spellings_are_refused(raw_path: str) -> None:
    with pytest.raises(BadRequest) as refused:
        proxy_target(raw_path, 2, "")
    assert refused.value.status_code == 400
    assert raw_path in refused.value.message


def test_ordinary_paths_keep_their_segments_and_query() -> None:
    target = proxy_target(
        "/v1/modelstate/jobs/job_1/versions/3/files/adapter%20config.json", 2, "wait=5&tag=a%2Fb"
    )
    assert target.path == "/jobs/job_1/versions/3/files/adapter config.json"
    assert target.target == (
        "/v1/jobs/job_1/versions/3/files/adapter%20config.json?wait=5&tag=a%2Fb"
    )


def test_a_needlessly_encoded_segment_is_sent_in_one_canonical_spelling() -> None:
    assert target_of("/v1/modelstate/jobs/%6a%6F%62/versions") == "/v1/jobs/job/versions"
    assert target_of("/v1/modelstate/jobs/a%2eb") == "/v1/jobs/a.b"


def server_decoded_path(target: str) -> str:
    """What uvicorn puts in `scope["path"]` for a request target (and Starlette routes on)."""
    return unquote(target.partition("?")[0])


PIECES = [
    *"aZ09._-~ /\\%?#@:;=+!$&'()*,é",
    "%2e",
    "%2E",
    "%2f",
    "%2F",
    "%5c",
    "%00",
    "%ff",
    "%c3%a9",
    "%6a",
    "..",
]
raw_segments = st.lists(st.sampled_from(PIECES), max_size=8).map("".join)


@given(st.lists(raw_segments, min_size=1, max_size=6), st.sampled_from(["", "a=1", "b=%2F"]))
@example(["jobs", "mine", "..", "theirs"], "")
@example(["jobs", "mine%2F..", "theirs"], "")
def test_what_is_checked_is_what_the_service_receives(segments: list[str], query: str) -> None:
    raw_path = "/v1/svc/" + "/".join(segments)
    if "?" in raw_path or "#" in raw_path:  # a server splits these off before the path
        raw_path = raw_path.replace("?", "%3F").replace("#", "%23")
    try:
        target = proxy_target(raw_path, 2, query)
    except BadRequest:
        return
    sent = target.target
    # The forwarding client sends it byte for byte (no dot-segment removal, no re-encoding)...
    request = httpx2.Request("GET", "http://127.0.0.1:9" + sent)
    assert request.url.raw_path.decode("ascii") == sent
    # ...the service's server decodes it to exactly the path the scope rules read...
    assert server_decoded_path(sent) == "/v1" + target.path
    assert all(segment not in (".", "..", "") for segment in target.segments)
    # ...and the canonical form is a fixed point.
    assert target_of("/v1/svc" + sent.partition("?")[0].removeprefix("/v1"), query) == sent
