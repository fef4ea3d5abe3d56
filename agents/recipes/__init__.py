"""Managed runs: recipes (training loops written with the SDK) that Loom's worker runs,
checkpoints and resumes. A recipe is a `Recipe` registered under the `loom.recipes` entry-point
group (see `services.worker.recipe_registry`, where the worker and the gateway find them);
`run` is what its loop gets."""

from agents.recipes.recipe import Recipe
from agents.recipes.run import RecipeRun
from services.worker.recipe_registry import (
    ENTRY_POINT_GROUP,
    RunStopped,
    load_recipe,
    registered,
)

__all__ = ["ENTRY_POINT_GROUP", "Recipe", "RecipeRun", "RunStopped", "load_recipe", "registered"]
