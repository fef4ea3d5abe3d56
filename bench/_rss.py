"""Peak resident memory of a group of process trees, sampled: what a framework's processes
hold together at their worst moment (a service and every process it started: vLLM's engine
core and workers, a trainer's ranks)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import suppress
from types import TracebackType

import psutil


def tree_rss(roots: Sequence[int]) -> int:
    """Bytes resident now in `roots` and all their descendants (each process once; processes
    that end meanwhile count as nothing)."""
    seen: dict[int, psutil.Process] = {}
    for pid in roots:
        with suppress(psutil.NoSuchProcess):
            root = psutil.Process(pid)
            for process in [root, *root.children(recursive=True)]:
                seen.setdefault(process.pid, process)
    total = 0
    for process in seen.values():
        with suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += process.memory_info().rss
    return total


class PeakRss:
    """Samples `tree_rss(roots())` every `interval_s` on a thread while in the block; `peak`
    is the largest sum seen. `roots` is called at each sample, so a process started inside
    the block (an arm's driver) is counted from its start."""

    def __init__(self, roots: Callable[[], Sequence[int]], interval_s: float = 0.1) -> None:
        self.roots = roots
        self.interval_s = interval_s
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-rss", daemon=True)

    def sample(self) -> None:
        self.peak = max(self.peak, tree_rss(self.roots()))
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _error: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()  # at least one sample, however short the block
