"""Managed runs: recipes (training loops written with the SDK) that Loom's worker runs,
checkpoints and resumes. See `services.worker.recipe_registry` for how one is registered (the
worker and the gateway find recipes there), `run` for what it gets."""

from agents.recipes.run import RecipeRun
from services.worker.recipe_registry import (
    ENTRY_POINT_GROUP,
    Recipe,
    RunStopped,
    load_recipe,
    registered,
)

__all__ = ["ENTRY_POINT_GROUP", "Recipe", "RecipeRun", "RunStopped", "load_recipe", "registered"]
