"""The background task state machine: every status change goes through `move_task`, checked
against one table of allowed moves, which also keeps the timestamps.

queued    → sent to the broker (or waiting out an upstream outage before its next attempt)
running   → a worker holds it (`attempts` counts the starts; `heartbeat_at` shows it is alive)
succeeded → done, `result` set
failed    → a user fault, too many outages, or the broker was unreachable at submit
cancelled → asked to stop: a queued task never runs, a running one stops at its next heartbeat
"""

from __future__ import annotations

from datetime import datetime

from services.common.states import require_transition
from services.worker.models import BackgroundTaskRow
from services.worker.task_schemas import TaskStatus

S = TaskStatus
TRANSITIONS: dict[TaskStatus, frozenset[TaskStatus]] = {
    S.queued: frozenset({S.running, S.failed, S.cancelled}),
    # running → running: the worker running it was lost (no heartbeat) and another takes over;
    # running → queued: an upstream outage, tried again after a backoff.
    S.running: frozenset({S.running, S.succeeded, S.failed, S.queued, S.cancelled}),
    S.failed: frozenset({S.queued}),  # retry
    S.succeeded: frozenset(),
    S.cancelled: frozenset(),
}


def move_task(task: BackgroundTaskRow, target: TaskStatus, now: datetime) -> None:
    require_transition(
        TRANSITIONS, TaskStatus(task.status), target, f"Task {task.id}", {"task_id": task.id}
    )
    task.status = target.value
    if target is S.running:
        task.started_at = task.heartbeat_at = now
        task.finished_at = None
    elif target is S.queued:
        task.finished_at = task.heartbeat_at = None
    else:
        task.finished_at = now
