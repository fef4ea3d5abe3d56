"""Non-blocking pipe I/O with a sandboxed child, driven by the event loop (no thread per pipe).

`OutputCapture` keeps the first `limit` bytes of a stream, keeps draining past it so the child
never blocks on a full pipe, and reports a flood once the overflow passes a bound, so the caller
can kill a program that would otherwise print until its timeout. `InputFeeder` writes stdin as
the child reads it and closes the pipe at the end (the child sees EOF).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable

CHUNK = 65536
TAIL_BYTES = 4096


class OutputCapture:
    def __init__(self, fd: int, limit: int, overflow: int, on_flood: Callable[[], None]) -> None:
        self._fd = fd
        self._limit = limit
        self._overflow = overflow
        self._on_flood = on_flood
        self._loop = asyncio.get_running_loop()
        self.head = bytearray()
        self.tail = bytearray()  # the last bytes seen, for diagnosis when the head is truncated
        self.total = 0
        self.closed: asyncio.Future[None] = self._loop.create_future()
        os.set_blocking(fd, False)
        self._loop.add_reader(fd, self._on_readable)

    @property
    def truncated(self) -> bool:
        return self.total > self._limit

    def text(self) -> str:
        return self.head.decode("utf-8", errors="replace")

    def tail_text(self) -> str:
        return self.tail.decode("utf-8", errors="replace")

    def _on_readable(self) -> None:
        try:
            chunk = os.read(self._fd, CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.close()
            return
        room = self._limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
        self.tail = (self.tail + chunk)[-TAIL_BYTES:]
        self.total += len(chunk)
        if self.total > self._limit + self._overflow:
            self._on_flood()

    def close(self) -> None:
        if self.closed.done():
            return
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self.closed.set_result(None)


class InputFeeder:
    def __init__(self, fd: int, data: bytes) -> None:
        self._fd = fd
        self._view = memoryview(data)
        self._loop = asyncio.get_running_loop()
        self._open = True
        if not data:
            self.close()
            return
        os.set_blocking(fd, False)
        self._loop.add_writer(fd, self._on_writable)

    def _on_writable(self) -> None:
        try:
            written = os.write(self._fd, self._view[:CHUNK])
        except BlockingIOError:
            return
        except OSError:  # the child closed stdin or exited: the rest is not wanted
            self.close()
            return
        self._view = self._view[written:]
        if not self._view:
            self.close()

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        self._loop.remove_writer(self._fd)
        with contextlib.suppress(OSError):
            os.close(self._fd)
