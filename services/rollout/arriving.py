"""A file a replica is still fetching, served to a peer as its bytes arrive (the chain of
`services.rollout.fanout`: replica k reads replica k-1's `.part` file while k-1 receives it, so
the last replica of a chain is served about when the first is, not one whole copy later).

These bytes are not verified yet: the serving replica checks them only once they are all in.
What protects the receiver is its own check: it hashes the whole file against the manifest
before renaming it into place (`modelstate.transfer.download_file`), so bytes that were wrong
upstream are refused downstream too and fetched again from the next source. A replica loads
and reports as held only files it verified; serving arriving bytes is only ever a relay.

The stream ends early (the receiver sees a cut transfer and resumes elsewhere) when the fetch
here ends without the file, or the part file is removed (its check failed)."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from fastapi.responses import StreamingResponse

from modelstate.blobstore import CHUNK_BYTES
from modelstate.transfer import part_path

# How often a reader that caught up with the writer looks again: short next to the time a
# megabyte takes to arrive, long enough that waiting costs no CPU worth measuring.
POLL_S = 0.005
RANGE = re.compile(r"^bytes=(\d+)-$")  # what `download_file` asks when it resumes


class ArrivalStopped(Exception):
    """The fetch here ended without the whole file: the peer reading it goes elsewhere."""


@dataclass
class Arriving:
    """A file being fetched into `target` (through its part file); `fetching` turns False
    when that fetch ends, whether the file was verified and renamed into place or not."""

    target: Path
    size: int
    fetching: bool = True

    @property
    def part(self) -> Path:
        return part_path(self.target)


def arriving_response(arriving: Arriving, range_header: str | None) -> StreamingResponse:
    """The file from the requested offset (`bytes=N-`, the only form resumes send; any other
    range gets the whole file, which HTTP allows)."""
    wanted = RANGE.match(range_header or "")
    start = int(wanted.group(1)) if wanted else 0
    headers = {}
    if wanted and start < arriving.size:
        headers["Content-Range"] = f"bytes {start}-{arriving.size - 1}/{arriving.size}"
        status = 206
    else:
        start, status = 0, 200
    headers["Content-Length"] = str(arriving.size - start)
    return StreamingResponse(
        read_as_it_arrives(arriving, start),
        status_code=status,
        headers=headers,
        media_type="application/octet-stream",
    )


async def read_as_it_arrives(arriving: Arriving, start: int) -> AsyncIterator[bytes]:
    """`arriving`'s bytes from `start` to its size, waiting for the writer when caught up."""
    handle = await _opened(arriving)
    with handle:
        handle.seek(start)
        sent = start
        while sent < arriving.size:
            ended = not arriving.fetching  # read before the read: no byte is missed after
            chunk = await asyncio.to_thread(handle.read, min(CHUNK_BYTES, arriving.size - sent))
            if chunk:
                sent += len(chunk)
                yield chunk
            elif ended or os.fstat(handle.fileno()).st_nlink == 0:
                raise ArrivalStopped(f"{arriving.target.name} stopped at {sent} bytes")
            else:
                await asyncio.sleep(POLL_S)


async def _opened(arriving: Arriving) -> BinaryIO:
    """The part file once the fetch here has started writing it, or the file itself if it
    was completed (checked and renamed) meanwhile."""
    while True:
        ended = not arriving.fetching
        for path in (arriving.part, arriving.target):
            try:
                return open(path, "rb")  # noqa: SIM115 -- the caller closes it
            except FileNotFoundError:
                continue
        if ended:
            raise ArrivalStopped(f"{arriving.target.name} never arrived")
        await asyncio.sleep(POLL_S)
