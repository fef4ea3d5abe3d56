"""The one path the proxy both authorises and forwards.

A path can name the same resource in many spellings: `a/../b`, `a/%2e%2e/b`, `a//b`, `a%2Fb`.
If the gateway checked one spelling and the service (or the HTTP client between them, which
removes dot segments) acted on another, a job key could reach another key's job. So the raw path
is decoded segment by segment once; a segment that would be read differently on the other side
(a dot segment, an empty one, an encoded slash or backslash, a control character, bytes that are
not UTF-8) is refused with a 400; and the service receives the decoded segments re-encoded in
one canonical spelling, which its server decodes back to exactly the segments checked here.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, unquote_to_bytes

from services.common.errors import BadRequest

# RFC 3986 `pchar` minus `%`: what a segment may hold unencoded.
SEGMENT_SAFE = "!$&'()*+,;=:@-._~"
DOT_SEGMENTS = frozenset({".", ".."})


@dataclass(frozen=True)
class ProxyTarget:
    segments: tuple[str, ...]  # decoded, after `/v1/<service>`
    query: str  # raw, as received

    @property
    def path(self) -> str:
        """The decoded path the scope rules read, e.g. `/jobs/j1/versions`."""
        return "".join(f"/{segment}" for segment in self.segments)

    @property
    def target(self) -> str:
        """What the service receives: `/v1/<canonical path>?<query>`."""
        encoded = "".join(f"/{quote(segment, safe=SEGMENT_SAFE)}" for segment in self.segments)
        return f"/v1{encoded}" + (f"?{self.query}" if self.query else "")


def proxy_target(raw_path: str, service_prefix_segments: int, query: str) -> ProxyTarget:
    """Parse `raw_path` (still percent-encoded, e.g. `/v1/modelstate/jobs/j1`), dropping its
    first `service_prefix_segments` segments (`v1`, the service name)."""
    parts = raw_path.split("/")
    if parts[0] != "":
        raise BadRequest("The request path must start with '/'.", {"path": raw_path})
    segments = tuple(_segment(part, raw_path) for part in parts[1 + service_prefix_segments :])
    return ProxyTarget(segments=segments, query=query)


def _segment(raw: str, raw_path: str) -> str:
    def refuse(why: str) -> BadRequest:
        return BadRequest(
            f"The request path {raw_path!r} is refused: {why}. Send the path of "
            "the resource itself, each segment percent-encoded at most once.",
            {"path": raw_path, "segment": raw},
        )

    if raw == "":
        raise refuse("it has an empty segment ('//' or a trailing '/')")
    try:
        segment = unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise refuse("a segment is not UTF-8 once percent-decoded") from exc
    if segment in DOT_SEGMENTS:
        raise refuse("'.' and '..' segments (encoded or not) are not resolved")
    if "/" in segment or "\\" in segment:
        raise refuse("a segment holds an encoded '/' or a '\\'")
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in segment):
        raise refuse("a segment holds a control character")
    return segment
