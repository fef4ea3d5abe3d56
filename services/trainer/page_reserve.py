"""Files kept ready, already in the page cache, for a job's next save_weights to write over.

A save writes a version's files into page cache that must be allocated for them (the store
keeps earlier versions, so their pages are not reused). On virtual machines that hand free
guest memory back to the host (virtio-balloon free page reporting, common in clouds; this
development VM is one), filling memory the guest has not used for a while costs several times
more than filling memory it has: the host backs each page again on first touch. Measured here,
inside the running stack, for a 92 MiB save: 120–230 ms into new page cache, 19–20 ms over the
cached pages of an existing file. Freeing cached pages just before the save helps little
(120–130 ms): the allocator mostly hands out other pages.

So after each save, off the critical path, the reserve creates files with the names and sizes
of the save's weight files next to its directory, with `fallocate` (no data written) and a read
through each file, which caches zeroed pages without disk I/O. The next save moves each file
into its new directory (`claim`) and writes over it in place (`safetensors_inplace`). The pages
are clean: the kernel may reclaim them under memory pressure like any cache, so the reserve
never holds memory that is needed elsewhere; a reclaimed or missing reserve file only makes
that save as slow as it would have been without one.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 20
DEFAULT_MAX_BYTES = 4 << 30
PREFIX = "page-reserve-"


class PageReserve:
    """One job's reserve. `claim` and `release` before and after its save, `refill` after
    it is published; all on the job's operation thread (the filling runs on its own)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._directory: Path | None = None
        self._filling: threading.Thread | None = None

    def claim(self, target: Path) -> None:
        """Move the reserved file named like `target` to `target`, if there is one on its file
        system (moving changes no page: the cached pages go with the file)."""
        self._wait()
        if self._directory is None:
            return
        try:
            os.rename(self._directory / target.name, target)
        except OSError:  # none of that name, another file system, or collected: write anew
            return

    def release(self) -> None:
        """Drop whatever was not claimed."""
        self._wait()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    def refill(self, parent: Path, files: dict[str, int]) -> None:
        """Start reserving `files` (name → size, up to `max_bytes` in all) in a new directory
        under `parent`, which must be on the file system the next save writes to."""
        self.release()
        budget, wanted = self.max_bytes, {}
        for name, size in files.items():
            if 0 < size <= budget:
                wanted[name] = size
                budget -= size
        if not wanted:
            return
        self._directory = parent / f"{PREFIX}{uuid.uuid4().hex}"
        self._filling = threading.Thread(
            target=_fill, args=(self._directory, wanted), name="page-reserve", daemon=True
        )
        self._filling.start()

    def _wait(self) -> None:
        if self._filling is not None:
            self._filling.join()
            self._filling = None


def remove_leftovers(parent: Path) -> None:
    """Reserves under `parent` left by a trainer that was killed (in the store's staging
    area, its garbage collection removes them too)."""
    for directory in parent.glob(f"{PREFIX}*"):
        shutil.rmtree(directory, ignore_errors=True)


def _fill(directory: Path, files: dict[str, int]) -> None:
    try:
        directory.mkdir(parents=True)
        for name, size in files.items():
            descriptor = os.open(directory / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.posix_fallocate(descriptor, 0, size)
                _read_through(descriptor, size)
            finally:
                os.close(descriptor)
    except OSError as exc:  # e.g. no fallocate on this file system: saves work as before
        log.warning("no page reserve in %s: %s", directory, exc)
        shutil.rmtree(directory, ignore_errors=True)


def _read_through(descriptor: int, size: int) -> None:
    """Read the file into one small buffer: the kernel caches every page read."""
    buffer = memoryview(bytearray(READ_CHUNK))
    offset = 0
    while offset < size and (count := os.preadv(descriptor, [buffer], offset)):
        offset += count
