"""Settings of the background worker (`LOOM_WORKER_*`). The gateway reads them too: it sends
tasks to the same broker and queue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from services.common.settings import LoomSettings


class WorkerSettings(LoomSettings):
    worker_broker_url: str | None = Field(
        default=None,
        description="Celery broker, e.g. redis://redis:6379/0 (compose, production). Unset: "
        "kombu's filesystem transport under <data_dir>/celery/, which needs no server (one "
        "host only; the message of a task whose worker is killed is gone there, and the "
        "worker's sweep for lost tasks sends it again).",
    )
    worker_result_backend: str | None = Field(
        default=None,
        description="Celery result backend. Unset: none; task status and results live in the "
        "gateway's database (GET /v1/tasks/{id}) either way.",
    )
    worker_queue: str = Field(
        default="loom",
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="Queue the gateway sends tasks to and the worker consumes.",
    )
    worker_redis_prefix: str = Field(
        default="",
        max_length=64,
        pattern=r"^[A-Za-z0-9._:-]*$",
        description="Redis: a prefix for every key Celery keeps there, so several Looms (or "
        "test runs) can share one Redis database.",
    )
    worker_visibility_timeout_s: float = Field(
        default=3600.0,
        gt=0,
        description="Redis: a message taken by a worker that vanished (killed, host lost) is "
        "delivered again after this long (acks are late: a task is acknowledged when it ends).",
    )
    worker_concurrency: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Tasks one worker runs at once (prefork processes). A managed run holds "
        "one for its whole length, so keep one more than the runs you expect at a time.",
    )
    worker_heartbeat_s: float = Field(
        default=5.0,
        gt=0,
        description="A running task refreshes its heartbeat this often (and notices a cancel). "
        "One silent for 3 heartbeats belongs to a lost worker: it is queued and sent again.",
    )
    worker_max_retries: int = Field(
        default=5,
        ge=0,
        description="Attempts in a row a task may lose to an upstream error while every "
        "service is ready (a 5xx that is not an outage); progress (a managed run's "
        "checkpoint) starts the count again. A user fault (4xx) fails it at once.",
    )
    worker_retry_backoff_s: float = Field(
        default=2.0,
        gt=0,
        description="First wait before such a retry; doubled each time, at most 5 minutes.",
    )
    worker_outage_window_s: float = Field(
        default=900.0,
        gt=0,
        description="How long a task waits for services that are not ready (restarting, an "
        "engine starting) before it fails; waiting counts no retry and holds no worker. Long "
        "enough for a vLLM start on a GPU node.",
    )
    worker_gc_interval_s: float = Field(
        default=0.0,
        ge=0,
        description="Celery beat runs a version garbage collection (a `gc` task, without a job) "
        "this often; 0: off. Modelstate also collects on its own timer "
        "(LOOM_MODELSTATE_GC_INTERVAL_S): use this one when that timer is off.",
    )
    worker_publish_timeout_s: float = Field(
        default=3.0,
        gt=0,
        description="How long sending a task may wait for the broker before the submit fails "
        "with 503.",
    )

    @property
    def celery_dir(self) -> Path:
        return self.data_dir / "celery"

    @property
    def stale_after_s(self) -> float:
        return 3 * self.worker_heartbeat_s

    def broker(self) -> tuple[str, dict[str, Any]]:
        """The broker URL and its transport options."""
        if self.worker_broker_url:
            return self.worker_broker_url, {
                "visibility_timeout": self.worker_visibility_timeout_s,
                # Look for messages past their visibility timeout every quarter of it (kombu's
                # default, ~100 s, is for hour-long timeouts); one cheap query each time.
                "unacked_restore_interval": max(
                    1.0, min(60.0, self.worker_visibility_timeout_s / 4)
                ),
                "unacked_restore_throttle": 1,
                "socket_connect_timeout": self.worker_publish_timeout_s,
                **(
                    {"global_keyprefix": self.worker_redis_prefix}
                    if self.worker_redis_prefix
                    else {}
                ),
            }
        queue, control = self.celery_dir / "queue", self.celery_dir / "control"
        for directory in (queue, control):
            directory.mkdir(parents=True, exist_ok=True)
        return "filesystem://localhost/", {
            "data_folder_in": str(queue),
            "data_folder_out": str(queue),
            "control_folder": str(control),
            "polling_interval": 0.2,
        }
