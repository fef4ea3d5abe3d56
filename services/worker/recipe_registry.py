"""Recipes: training loops written with the SDK that Loom's worker runs for you (a managed
run: `POST /v1/jobs/{id}/tasks` with kind `recipe`). A recipe is a `Recipe` object registered
under the `loom.recipes` entry-point group of any installed distribution (Loom's own, in
`agents/recipes` and `agents/examples`, too), so a platform engineer adds one by installing a
package:

    [project.entry-points."loom.recipes"]
    my_recipe = "my_package.recipes:MY_RECIPE"
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from services.common.errors import InvalidInput

if TYPE_CHECKING:  # what a recipe's loop gets; the worker finds recipes by entry point only
    from agents.recipes.run import RecipeRun

ENTRY_POINT_GROUP = "loom.recipes"
C = TypeVar("C", bound=BaseModel)


@dataclass(frozen=True)
class Recipe(Generic[C]):
    """`run(run, config)` trains the run's job from `run.start_step` on, calls
    `run.checkpoint(step, state)` at least every few steps, and returns a JSON summary."""

    name: str
    config: type[C]
    run: Callable[[RecipeRun, C], dict[str, Any]]
    description: str
    # The services its loop calls through the gateway: after an outage, a run waits for these
    # to be ready again (and for no other).
    services: tuple[str, ...] = ("trainer", "modelstate")

    def parse_config(self, raw: dict[str, Any]) -> C:
        try:
            return self.config.model_validate(raw)
        except ValidationError as exc:
            errors = [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()]
            raise InvalidInput(f"Config of recipe {self.name!r} is invalid: "
                               f"{_first_error(errors)}", {"errors": errors}) from None


class RunStopped(Exception):
    """Raised by the worker at a step boundary of a recipe's loop when the run must end there:
    its task was cancelled or taken over (`cancel_task` False: someone else owns the outcome)
    or its job cancelled."""

    def __init__(self, message: str, *, cancel_task: bool) -> None:
        super().__init__(message)
        self.cancel_task = cancel_task


def _first_error(errors: list[dict[str, Any]]) -> str:
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"]) or "config"
    return f"{where}: {first['msg']}" + (f" (and {len(errors) - 1} more)" if errors[1:] else "")


def registered() -> dict[str, EntryPoint]:
    return {point.name: point for point in entry_points(group=ENTRY_POINT_GROUP)}


def load_recipe(name: str) -> Recipe[Any]:
    point = registered().get(name)
    if point is None:
        raise InvalidInput(f"No recipe {name!r}; registered: {sorted(registered()) or 'none'}.",
                           {"recipe": name})
    recipe = point.load()
    if not isinstance(recipe, Recipe) or recipe.name != name:
        raise InvalidInput(f"Entry point {point.value!r} ({ENTRY_POINT_GROUP}: {name}) is not "
                           f"a Recipe named {name!r}.", {"recipe": name})
    return recipe
