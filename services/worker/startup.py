"""What the worker does around consuming: migrate its tables once the gateway has made the
`jobs` they refer to, send again the tasks whose messages may be lost (at start, then those of
lost workers periodically), report alive (a liveness row, which the gateway's `/v1/health`
reads), and tell `loom up` it is ready (a file holding its pid: a worker has no port)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

from celery import signals
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from services.common.columns import utcnow
from services.common.db import make_engine, make_sessionmaker, migrate, transaction
from services.worker.app import LoomCelery, send
from services.worker.liveness import forget, mark_alive
from services.worker.models import ALEMBIC_DIR, VERSION_TABLE, GatewayNotMigrated
from services.worker.schemas import TaskKind
from services.worker.task_leases import lost_waits, requeue_abandoned, unsent_tasks

log = logging.getLogger(__name__)


def migrate_when_ready(url: str, timeout_s: float) -> None:
    """Bring the worker's tables to their newest revision, waiting (up to `timeout_s`) for
    the database and for the gateway's `jobs`, which tasks refer to (the gateway migrates
    it at start; whichever starts first, both end migrated)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            migrate(url, ALEMBIC_DIR, VERSION_TABLE)
            return
        except (GatewayNotMigrated, SQLAlchemyError) as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"The worker's tables could not be migrated in {timeout_s:.0f} s: {exc}"
                ) from exc
            log.info("worker tables not migrated yet: %s", str(exc).splitlines()[0])
        time.sleep(0.5)


@contextlib.contextmanager
def own_transaction(app: LoomCelery) -> Iterator[Session]:
    """A transaction on the worker's tables over an engine of its own, disposed at the end:
    never inherited by the forked pool processes."""
    engine = make_engine(app.loom_settings.database_url_for("gateway"))
    try:
        with transaction(make_sessionmaker(engine)) as session:
            yield session
    finally:
        engine.dispose()


def sweep_once(app: LoomCelery, worker_id: str, *, unsent_too: bool) -> list[str]:
    """Report this worker alive, then queue again and send the tasks whose worker was lost
    (`requeue_abandoned`), those whose wait for services went silent (`lost_waits`) and,
    with `unsent_too`, those queued long enough that their message may be lost
    (`unsent_tasks`). One transaction for all."""
    settings = app.loom_settings
    with own_transaction(app) as session:
        now = utcnow()
        mark_alive(session, worker_id, os.getpid(), now)
        rows = requeue_abandoned(session, now, settings.stale_after_s)
        rows += lost_waits(session, now, settings.stale_after_s)
        if unsent_too:
            rows += unsent_tasks(session, now, settings.stale_after_s)
        lost = {row.id: (TaskKind(row.kind), row.job_id, row.params) for row in rows}
    for task_id, (kind, job_id, params) in lost.items():  # sent once the requeue committed
        send(app, task_id, kind, job_id, params)
    if lost:
        log.warning("sent %d lost task(s) again: %s", len(lost), sorted(lost))
    return sorted(lost)


def announce_readiness(app: LoomCelery) -> None:
    """Once consuming: recover lost tasks (then every `stale_after_s`, those of lost workers),
    report alive, and write the ready file; remove both at shutdown."""
    ready_file = app.loom_settings.ready_file
    worker_ids: list[str] = []

    def sweep() -> None:
        try:
            sweep_once(app, worker_ids[0], unsent_too=False)
        except Exception:  # the next sweep tries again; the consumer must keep running
            log.exception("recovering lost tasks failed")

    def ready(sender: Any, **_: Any) -> None:
        worker_ids.append(str(sender.hostname))
        sweep_once(app, worker_ids[0], unsent_too=True)
        sender.timer.call_repeatedly(app.loom_settings.stale_after_s, sweep)
        ready_file.parent.mkdir(parents=True, exist_ok=True)
        temp = ready_file.with_name(f".{ready_file.name}.{os.getpid()}")
        temp.write_text(str(os.getpid()))
        temp.replace(ready_file)

    def shutdown(**_: Any) -> None:
        if is_ready(ready_file, os.getpid()):
            ready_file.unlink(missing_ok=True)
        if worker_ids:
            try:
                with own_transaction(app) as session:
                    forget(session, worker_ids[0])
            except Exception:  # the row goes stale on its own
                log.exception("removing the worker's liveness row failed")

    signals.worker_ready.connect(ready, weak=False)
    signals.worker_shutdown.connect(shutdown, weak=False)


def is_ready(ready_file: os.PathLike[str], pid: int) -> bool:
    try:
        with open(ready_file) as marker:
            return marker.read().strip() == str(pid)
    except OSError:
        return False
