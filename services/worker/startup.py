"""What the worker does around consuming: wait until the gateway has migrated its database,
send again the tasks whose messages may be lost (at start, then those of lost workers
periodically), report alive to the gateway's database (a liveness row, which `/v1/health`
reads), and tell `loom up` it is ready (a file holding its pid: a worker has no port)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from celery import signals
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from gateway.models import ALEMBIC_DIR, VERSION_TABLE, utcnow
from gateway.task_leases import lost_waits, requeue_abandoned, unsent_tasks
from gateway.workers import forget, mark_alive
from services.common.db import make_engine, make_sessionmaker, transaction
from services.worker.app import LoomCelery, send
from services.worker.schemas import TaskKind

log = logging.getLogger(__name__)


def wait_for_schema(url: str, timeout_s: float) -> None:
    """Block until the gateway's tables are at the newest revision (the gateway migrates
    them at start; the worker only reads and writes rows)."""
    config = Config()
    config.set_main_option("script_location", str(ALEMBIC_DIR))
    head = ScriptDirectory.from_config(config).get_current_head()
    engine = make_engine(url)
    deadline = time.monotonic() + timeout_s
    current: str | None = None
    try:
        while True:
            try:
                with engine.connect() as connection:
                    current = MigrationContext.configure(connection, opts={
                        "version_table": VERSION_TABLE}).get_current_revision()
            except SQLAlchemyError as exc:
                log.info("gateway database not reachable yet: %s", exc)
            if current == head:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"The gateway database is at revision {current}, not {head}, "
                                   f"after {timeout_s:.0f} s: start the gateway (it migrates).")
            time.sleep(0.5)
    finally:
        engine.dispose()


@contextlib.contextmanager
def own_transaction(app: LoomCelery) -> Iterator[Session]:
    """A transaction on the gateway's database over an engine of its own, disposed at the
    end: never inherited by the forked pool processes."""
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
