"""Path segments as every Loom client spells them.

A value put in a URL path (a version ref, an alias, a job id) is percent-encoded whole, `/`
included, and a value that is a dot segment ('.' or '..') has its dots encoded too: HTTP clients
remove dot segments before sending, which would turn `versions/..` into another resource. The
gateway then refuses such a path with a 400 that names it, instead of acting on the wrong thing.
"""

from __future__ import annotations

from urllib.parse import quote


def segment(value: object) -> str:
    text = quote(str(value), safe="")
    return text.replace(".", "%2E") if text in (".", "..") else text
