"""Recipes: training loops written with the SDK that Loom's worker runs for you (a managed
run: `POST /v1/jobs/{id}/tasks` with kind `recipe`). A recipe is a `Recipe` object registered
under the `loom.recipes` entry-point group of any installed distribution (Loom's own, in
`agents/recipes` and `agents/examples`, too), so a platform engineer adds one by installing a
package:

    [project.entry-points."loom.recipes"]
    my_recipe = "my_package.recipes:MY_RECIPE"

The worker hosts any object with `HostedRecipe`'s shape; recipes written with Loom's SDK are
`agents.recipes.Recipe`s, which build the SDK's client for each attempt.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel

from services.common.errors import InvalidInput
from services.worker.schemas import RunProgress

ENTRY_POINT_GROUP = "loom.recipes"


@dataclass(frozen=True)
class RecipeAttempt:
    """What the worker gives an attempt of a managed run: where the gateway is, a key that
    acts for the run's job only, the checkpoint to resume from, and its hooks back into the
    worker (record progress on the task row; the stop flag a lost claim sets)."""

    task_id: str
    attempt: int
    job_id: str
    gateway_url: str
    secret: str
    resumed: RunProgress | None
    record: Callable[[RunProgress], None]
    stop: threading.Event


@runtime_checkable
class HostedRecipe(Protocol):
    """What the worker needs of a recipe; `agents.recipes.Recipe` is the one Loom ships (the
    worker finds recipes by entry point, and never imports the SDK they are written with)."""

    name: str
    description: str
    config: type[BaseModel]
    # The services its loop calls through the gateway: after an outage, a run waits for these
    # to be ready again (and for no other).
    services: tuple[str, ...]

    def parse_config(self, raw: dict[str, Any]) -> BaseModel:
        """The run's config, or InvalidInput naming the first bad field."""

    def execute(self, attempt: RecipeAttempt, config: Any) -> tuple[dict[str, Any], int]:
        """Run (or resume) to the end; the recipe's JSON summary and the last step done."""


class RunStopped(Exception):
    """Raised by the worker at a step boundary of a recipe's loop when the run must end there:
    its task was cancelled or taken over (`cancel_task` False: someone else owns the outcome)
    or its job cancelled."""

    def __init__(self, message: str, *, cancel_task: bool) -> None:
        super().__init__(message)
        self.cancel_task = cancel_task


def registered() -> dict[str, EntryPoint]:
    return {point.name: point for point in entry_points(group=ENTRY_POINT_GROUP)}


def load_recipe(name: str) -> HostedRecipe:
    point = registered().get(name)
    if point is None:
        raise InvalidInput(
            f"No recipe {name!r}; registered: {sorted(registered()) or 'none'}.", {"recipe": name}
        )
    recipe = point.load()
    if not isinstance(recipe, HostedRecipe) or recipe.name != name:
        raise InvalidInput(
            f"Entry point {point.value!r} ({ENTRY_POINT_GROUP}: {name}) is not "
            f"a Recipe named {name!r}.",
            {"recipe": name},
        )
    return recipe
