"""A proxied stream broken mid-way ends with an error event of its own kind (SSE, NDJSON),
never silently; another body is cut short. No network: the upstream is a response whose body
fails after its first chunk."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx2
import pytest

from gateway.proxy.forward import guarded


class Breaks(httpx2.AsyncByteStream):
    def __init__(self, first: bytes) -> None:
        self.first = first

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.first
        raise httpx2.ReadError("connection reset by peer")


async def read(content_type: str, first: bytes, **headers: str) -> tuple[bytes, bool]:
    released = []

    async def release() -> None:
        released.append(True)

    upstream = httpx2.Response(
        200, headers={"content-type": content_type, **headers}, stream=Breaks(first)
    )
    body = b"".join([chunk async for chunk in guarded(upstream, "rollout", release)])
    return body, released == [True]


@pytest.mark.parametrize(
    "first", [b'data: {"id": 1}\n\n', b'data: {"id": 1}\n', b'data: {"id": 1}']
)
async def test_a_broken_sse_stream_ends_with_an_error_event_and_done(first: bytes) -> None:
    body, released = await read("text/event-stream", first)
    events = [line.removeprefix("data: ") for line in body.decode().split("\n\n")]
    assert events[0] == '{"id": 1}' and events[-2:] == ["[DONE]", ""], events
    assert json.loads(events[1])["error"]["code"] == "upstream_error"
    assert released


async def test_a_broken_ndjson_stream_ends_with_an_error_line_even_mid_line() -> None:
    body, _ = await read("application/x-ndjson", b'{"type": "group"')  # cut inside a line
    lines = body.decode().split("\n")
    assert len(lines) == 3 and lines[0] == '{"type": "group"' and lines[-1] == ""
    error = json.loads(lines[1])
    assert error["type"] == "error" and "broke" in error["error"]["message"]


@pytest.mark.parametrize(
    ("content_type", "headers"),
    [("application/json", {}), ("text/event-stream", {"content-encoding": "gzip"})],
)
async def test_another_body_is_cut_short(content_type: str, headers: dict[str, str]) -> None:
    with pytest.raises(httpx2.ReadError):
        await read(content_type, b'{"partial": ', **headers)
