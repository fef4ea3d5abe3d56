"""Managed runs: recipes (training loops written with the SDK) that Loom's worker runs,
checkpoints and resumes. See `registry` for how one is registered, `run` for what it gets."""

from agents.recipes.registry import ENTRY_POINT_GROUP, Recipe, load_recipe, registered
from agents.recipes.run import RecipeRun, RunStopped

__all__ = ["ENTRY_POINT_GROUP", "Recipe", "RecipeRun", "RunStopped", "load_recipe", "registered"]
