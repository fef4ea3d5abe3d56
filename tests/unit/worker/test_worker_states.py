"""The background task state machine and what a submit may carry: nothing running."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from services.common.errors import InvalidTransition
from services.common.schemas import ErrorBody
from services.worker.models import BackgroundTaskRow
from services.worker.schemas import MAX_EVAL_ITEMS, EvaluateParams, greedy
from services.worker.task_schemas import TaskCreate, TaskEnd, TaskStatus
from services.worker.task_states import TRANSITIONS, move_task

NOW = datetime(2026, 1, 1, tzinfo=UTC)
S = TaskStatus


def task(status: TaskStatus) -> BackgroundTaskRow:
    return BackgroundTaskRow(id="task_1", status=status.value)


@pytest.mark.parametrize(("start", "target"), [(a, b) for a in TaskStatus for b in TaskStatus])
def test_task_moves_follow_the_table(start: TaskStatus, target: TaskStatus) -> None:
    row = task(start)
    if target in TRANSITIONS[start]:
        move_task(row, target, NOW)
        assert row.status == target.value
    else:
        with pytest.raises(InvalidTransition, match=f"cannot become {target.value}"):
            move_task(row, target, NOW)
        assert row.status == start.value


def test_the_table_is_the_documented_lifecycle() -> None:
    assert set(TRANSITIONS) == set(TaskStatus)
    assert TRANSITIONS[S.queued] == {S.running, S.failed, S.cancelled}
    assert TRANSITIONS[S.failed] == {S.queued}  # only a retry leaves failed
    assert TRANSITIONS[S.succeeded] == TRANSITIONS[S.cancelled] == frozenset()


def test_moves_keep_the_timestamps() -> None:
    row = task(S.queued)
    move_task(row, S.running, NOW)
    assert row.started_at == row.heartbeat_at == NOW and row.finished_at is None
    move_task(row, S.failed, NOW)
    assert row.finished_at == NOW
    move_task(row, S.queued, NOW)  # a retry: not finished, no heartbeat until claimed
    assert row.finished_at is None and row.heartbeat_at is None


def parse(body: dict[str, Any]) -> Any:
    return TypeAdapter(TaskCreate).validate_python(body)


def errors(body: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    with pytest.raises(ValidationError) as raised:
        parse(body)
    return [(tuple(e["loc"]), e["msg"]) for e in raised.value.errors()]


def test_each_kind_has_its_params_and_defaults() -> None:
    gc = parse({"kind": "gc"})
    assert (gc.kind, gc.params.keep_last, gc.idempotency_key) == ("gc", None, None)
    export = parse({"kind": "export", "params": {"version": 3}, "idempotency_key": "k"})
    assert (export.params.version, export.idempotency_key) == (3, "k")
    evaluate = parse(
        {
            "kind": "evaluate",
            "params": {"verifier": "math", "items": [{"prompt": "1+1=", "reference": "2"}]},
        }
    )
    params: EvaluateParams = evaluate.params
    assert (params.name, params.version, params.pass_threshold) == ("heldout", "latest", 1.0)
    assert params.sampling == greedy() and params.sampling.temperature == 0.0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "train"}, "kind"),
        ({"params": {}}, "kind"),
        ({"kind": "gc", "params": {"keep_last": -1}}, "keep_last"),
        ({"kind": "gc", "params": {"grace_s": 0}}, "grace_s"),  # not settable through a task
        ({"kind": "gc", "idempotency_key": ""}, "idempotency_key"),
        ({"kind": "export", "params": {"version": -2}}, "version"),
        ({"kind": "export", "params": {"version": "../x"}}, "version"),
        ({"kind": "evaluate", "params": {"items": [{"prompt": "p"}]}}, "verifier"),
        ({"kind": "evaluate", "params": {"verifier": "math", "items": []}}, "items"),
        (
            {
                "kind": "evaluate",
                "params": {"verifier": "math", "name": "a/b", "items": [{"prompt": "p"}]},
            },
            "name",
        ),
        (
            {
                "kind": "evaluate",
                "params": {
                    "verifier": "math",
                    "items": [{"prompt": "p"}],
                    "sampling": {"temperature": -1},
                },
            },
            "temperature",
        ),
    ],
)
def test_bad_input_names_the_field(body: dict[str, Any], field: str) -> None:
    problems = errors(body)
    assert any(field in map(str, loc) or field in msg for loc, msg in problems), problems


def test_evaluation_sets_are_bounded() -> None:
    items = [{"prompt": "p"}] * (MAX_EVAL_ITEMS + 1)
    problems = errors({"kind": "evaluate", "params": {"verifier": "math", "items": items}})
    assert problems[0][0][-1] == "items" and str(MAX_EVAL_ITEMS) in problems[0][1]


def test_an_end_without_an_attempt_is_a_wait_that_gave_up_saying_why() -> None:
    why = ErrorBody(code="unavailable", message="Gave up: services not ready")
    assert TaskEnd(attempt=None, status=S.failed, error=why).attempt is None
    for status, error in ((S.succeeded, why), (S.failed, None)):
        with pytest.raises(ValidationError):
            TaskEnd(attempt=None, status=status, error=error)
