"""Workers' liveness. A Celery worker has no port to probe, so each one refreshes its row
while it consumes (`services.worker.startup`) and the stack's health reads the rows. Data
functions: they only flush; the caller owns the transaction."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from services.common.schemas import Health
from services.worker.models import WorkerRow


def mark_alive(session: Session, worker_id: str, pid: int, now: datetime) -> None:
    row = session.get(WorkerRow, worker_id, with_for_update=True)
    if row is None or row.pid != pid:  # a new process under a reused hostname starts afresh
        session.merge(WorkerRow(id=worker_id, pid=pid, started_at=now, seen_at=now))
    else:
        row.seen_at = now
    session.flush()


def forget(session: Session, worker_id: str) -> None:
    session.execute(delete(WorkerRow).where(WorkerRow.id == worker_id))


def worker_health(session: Session, now: datetime, stale_after_s: float) -> Health:
    """Ready while some worker was seen within `stale_after_s`."""
    cutoff = now - timedelta(seconds=stale_after_s)
    alive = list(
        session.scalars(select(WorkerRow).where(WorkerRow.seen_at >= cutoff).order_by(WorkerRow.id))
    )
    if not alive:
        return Health(
            service="worker",
            status="unreachable",
            version="unknown",
            detail={
                "error": f"No worker reported in the last {stale_after_s:.0f} s: background tasks "
                "and managed runs wait in the queue. Start one with `python -m "
                "services.worker` (`loom up` does)."
            },
        )
    return Health(
        service="worker",
        status="ready",
        version="unknown",
        detail={
            "workers": [
                {
                    "id": row.id,
                    "pid": row.pid,
                    "started_at": row.started_at.isoformat(),
                    "seen_s_ago": round((now - row.seen_at).total_seconds(), 1),
                }
                for row in alive
            ]
        },
    )
