"""How long a service's one scarce resource (the rollout engine, the trainer's device) was busy,
as a Prometheus counter: seconds with at least one piece of work in flight. Its rate's
complement is the resource's bubble, the idle fraction an async pipeline is meant to remove.

The counter includes the busy period in progress when scraped, so a reader that takes two
scrapes gets the exact busy time between them, however long the work items are."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector


class BusyClock(Collector):
    def __init__(self, name: str, documentation: str) -> None:
        self.name = name
        self.documentation = documentation
        self._lock = threading.Lock()
        self._in_flight = 0
        self._since = 0.0
        self._total = 0.0

    @contextmanager
    def busy(self) -> Iterator[None]:
        with self._lock:
            if self._in_flight == 0:
                self._since = time.monotonic()
            self._in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._total += time.monotonic() - self._since

    def seconds(self) -> float:
        with self._lock:
            ongoing = time.monotonic() - self._since if self._in_flight else 0.0
            return self._total + ongoing

    def collect(self) -> Iterable[CounterMetricFamily]:
        yield CounterMetricFamily(self.name, self.documentation, value=self.seconds())
