"""The one check behind every status state machine (jobs, background tasks): a move is
allowed only if the entity's transition table lists it."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from services.common.errors import InvalidTransition


def require_transition(
    table: Mapping[StrEnum, frozenset[StrEnum]],
    current: StrEnum,
    target: StrEnum,
    subject: str,
    detail: dict[str, str],
) -> None:
    """Raise InvalidTransition (409) naming `subject` and the moves it has unless
    `current → target` is in `table`."""
    if target in table[current]:
        return
    allowed = sorted(s.value for s in table[current]) or ["none: it is final"]
    raise InvalidTransition(
        f"{subject} is {current.value}; it cannot become {target.value} "
        f"(allowed: {', '.join(allowed)}).",
        {**detail, "status": current.value, "requested": target.value},
    )
