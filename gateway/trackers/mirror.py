"""Mirror every job's metrics to experiment trackers, from the one place all of them are
written: `job_logs.log_metrics` (SDK scripts, managed runs and the Weaver layer all log there;
the worker, for an evaluation's, attaches its own sessions). Logged samples
(`job_logs.log_samples`) go, as tables, to the trackers that opt in (`TrackerOptions.samples`).

`attach` hooks a sessionmaker: points logged in a transaction are staged on its session and
handed over only once it commits (a rolled-back write mirrors nothing). Each tracker has a lane
of its own, a bounded queue and one thread, so the request that logged the points only queues
them, and a tracker that is slow or failing delays no job and no other tracker. A failed
delivery is logged, counted (`loom_tracker_failures_total`), retried with backoff and, after
the last retry or with the queue full, dropped and counted (`loom_tracker_dropped_points_total`).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from gateway.models import JobRow
from gateway.schemas import MetricPoint, SampleRecord, job_trackers
from gateway.trackers.writers import WRITERS, TrackedJob, TrackerOptions, Writer

log = logging.getLogger(__name__)

MIRROR_KEY = "loom.tracker_mirror"
_PENDING_KEY = "loom.tracker_pending"
IDLE_POLL_S = 30.0  # how often a lane looks for writers idle long enough to close


@dataclass(frozen=True)
class _Batch:
    job: TrackedJob
    points: tuple[MetricPoint, ...]
    samples: tuple[SampleRecord, ...] = ()

    @property
    def size(self) -> int:
        """What the counters count: metric points and samples alike."""
        return len(self.points) + len(self.samples)

    def write(self, writer: Writer) -> None:
        if self.points:
            writer.log(self.points)
        if self.samples:
            writer.log_samples(self.samples)


class _Counters:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.points = Counter(
            "loom_tracker_points",
            "Metric points (and samples) a tracker accepted",
            ["tracker"],
            registry=registry,
        )
        self.failures = Counter(
            "loom_tracker_failures",
            "Failed deliveries to a tracker (each retry counts)",
            ["tracker"],
            registry=registry,
        )
        self.dropped = Counter(
            "loom_tracker_dropped_points",
            "Metric points given up on (retries spent or queue full)",
            ["tracker"],
            registry=registry,
        )


class _Lane:
    """One tracker: its queue, its thread, its open writer per job."""

    def __init__(
        self,
        name: str,
        options: TrackerOptions,
        counters: _Counters,
        *,
        retries: int,
        backoff_s: float,
        queue_size: int,
        idle_close_s: float,
    ) -> None:
        self.name = name
        self._options = options
        self._counters = counters
        self._retries = retries
        self._backoff_s = backoff_s
        self._idle_close_s = idle_close_s
        self._queue: queue.Queue[_Batch | None] = queue.Queue(maxsize=queue_size)
        self._writers: dict[str, tuple[Writer, float]] = {}  # job id -> (writer, last used)
        self._closing = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"tracker-{name}", daemon=True)
        self._thread.start()

    def submit(self, batch: _Batch) -> None:
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self._counters.dropped.labels(self.name).inc(batch.size)
            log.warning(
                "tracker %s: queue full, %d points of job %s dropped",
                self.name,
                batch.size,
                batch.job.id,
            )

    def begin_close(self) -> None:
        """Deliver what is queued, one try each, then close every writer."""
        self._closing.set()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)  # wakes the thread

    def end_close(self, deadline: float) -> None:
        """Wait for that until `deadline` (monotonic); then drop what is left, counted."""
        self._thread.join(max(0.0, deadline - time.monotonic()))
        self._stopping.set()
        if self._thread.is_alive():  # stuck in a tracker call: what waits behind it is lost
            self._drop_queued()

    def _run(self) -> None:
        while not self._stopping.is_set():
            closing = self._closing.is_set()
            try:
                batch = self._queue.get(timeout=0.1 if closing else IDLE_POLL_S)
            except queue.Empty:
                if closing:
                    break
                self._close_idle(time.monotonic() - self._idle_close_s)
                continue
            if batch is not None:
                self._deliver(batch)
        self._drop_queued()  # stopped at the deadline: whatever is still queued is given up
        self._close_idle(float("inf"))

    def _drop_queued(self) -> None:
        while True:
            try:
                left = self._queue.get_nowait()
            except queue.Empty:
                return
            if left is not None:
                self._counters.dropped.labels(self.name).inc(left.size)

    def _deliver(self, batch: _Batch) -> None:
        tries = 1 if self._closing.is_set() else self._retries + 1
        for attempt in range(tries):
            try:
                batch.write(self._writer(batch.job))
            except Exception as exc:  # any library error: the job must not notice
                self._counters.failures.labels(self.name).inc()
                log.warning(
                    "tracker %s: job %s, attempt %d: %s: %s",
                    self.name,
                    batch.job.id,
                    attempt + 1,
                    type(exc).__name__,
                    exc,
                )
                self._forget(batch.job.id)
                if attempt + 1 < tries and self._closing.wait(self._backoff_s * 2**attempt):
                    break  # closing: no more waiting between tries
            else:
                self._counters.points.labels(self.name).inc(batch.size)
                return
        self._counters.dropped.labels(self.name).inc(batch.size)

    def _writer(self, job: TrackedJob) -> Writer:
        known = self._writers.get(job.id)
        writer = known[0] if known else WRITERS[self.name](job, self._options)
        self._writers[job.id] = (writer, time.monotonic())
        return writer

    def _forget(self, job_id: str) -> None:
        known = self._writers.pop(job_id, None)
        if known is not None:
            _close_quietly(self.name, job_id, known[0])

    def _close_idle(self, used_before: float) -> None:
        for job_id, (_, used) in list(self._writers.items()):
            if used <= used_before:
                self._forget(job_id)


def _close_quietly(name: str, job_id: str, writer: Writer) -> None:
    try:
        writer.close()
    except Exception as exc:
        log.warning("tracker %s: closing job %s's run: %s", name, job_id, exc)


class TrackerMirror:
    """The lanes of one process, opened on first use; `default`: the trackers of jobs whose
    config names none."""

    def __init__(
        self,
        default: Sequence[str],
        options: TrackerOptions,
        registry: CollectorRegistry,
        *,
        retries: int = 3,
        backoff_s: float = 1.0,
        queue_size: int = 10_000,
        idle_close_s: float = 600.0,
    ) -> None:
        self.default = tuple(default)
        self._options = options
        self._counters = _Counters(registry)
        self._lane_options: dict[str, Any] = {
            "retries": retries,
            "backoff_s": backoff_s,
            "queue_size": queue_size,
            "idle_close_s": idle_close_s,
        }
        self._lanes: dict[str, _Lane] = {}
        self._lock = threading.Lock()

    def submit(
        self,
        job: TrackedJob,
        trackers: Sequence[str],
        points: Sequence[MetricPoint],
        samples: Sequence[SampleRecord] = (),
    ) -> None:
        """`samples` go only to the trackers that opt in to them."""
        for name in trackers:
            kept = tuple(samples) if name in self._options.samples else ()
            if points or kept:
                self._lane(name).submit(_Batch(job, tuple(points), kept))

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued, every lane at once, for up to `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            lanes, self._lanes = list(self._lanes.values()), {}
        for lane in lanes:
            lane.begin_close()
        for lane in lanes:
            lane.end_close(deadline)

    def _lane(self, name: str) -> _Lane:
        with self._lock:
            if name not in self._lanes:
                self._lanes[name] = _Lane(name, self._options, self._counters, **self._lane_options)
            return self._lanes[name]


def attach(sessions: sessionmaker[Session], mirror: TrackerMirror) -> None:
    """Sessions of `sessions` stage what `stage` is given and hand it over on commit."""
    sessions.configure(info={MIRROR_KEY: mirror})
    event.listen(sessions, "after_commit", _hand_over)
    event.listen(sessions, "after_rollback", _discard)


def stage(
    session: Session,
    job_id: str,
    points: Sequence[MetricPoint],
    samples: Sequence[SampleRecord] = (),
) -> None:
    """Queue `points` (and `samples`) of `job_id` for its trackers once `session` commits
    (nothing happens for a session whose sessionmaker was not attached, or a job that tracks
    nothing)."""
    mirror: TrackerMirror | None = session.info.get(MIRROR_KEY)
    if mirror is None:
        return
    row = session.get(JobRow, job_id)
    if row is None:
        return
    chosen = job_trackers(row.config)
    trackers = mirror.default if chosen is None else chosen
    if trackers:
        session.info.setdefault(_PENDING_KEY, []).append(
            (TrackedJob(id=row.id, name=row.name), trackers, list(points), list(samples))
        )


def _hand_over(session: Session) -> None:
    mirror: TrackerMirror = session.info[MIRROR_KEY]
    for job, trackers, points, samples in session.info.pop(_PENDING_KEY, []):
        mirror.submit(job, trackers, points, samples)


def _discard(session: Session) -> None:
    session.info.pop(_PENDING_KEY, None)
