"""`loom recipes` and `loom run`: managed runs from the command line. `run` creates a job,
submits the recipe to Loom's worker and follows it (the run goes on if you stop following:
it belongs to the worker)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from agents.sdk import LoomClient
from cli.common import (
    ApiKeyOption,
    DataDirOption,
    UrlOption,
    api_key_for,
    console,
    fail,
    require_gateway,
    settings_for,
)
from services.common.errors import LoomError
from services.trainer.schemas import TrainingMode
from services.worker.recipe_registry import load_recipe, registered
from services.worker.task_schemas import BackgroundTask, TaskStatus

FOLLOW_POLL_S = 2.0


def recipes() -> None:
    """List the registered recipes (entry points `loom.recipes`) and their config fields."""
    table = Table(title="Recipes")
    for column in ("name", "description", "config fields"):
        table.add_column(column)
    for name in sorted(registered()):
        recipe = load_recipe(name)
        table.add_row(name, recipe.description, ", ".join(recipe.config.model_fields))
    console.print(table)


def run(
    recipe: Annotated[str, typer.Argument(help="A registered recipe (`loom recipes`).")],
    config: Annotated[
        str, typer.Option("--config", help="The recipe's config: JSON, or @path to a JSON file.")
    ] = "{}",
    base_model: Annotated[str, typer.Option("--base-model")] = "loom/tiny",
    mode: Annotated[TrainingMode, typer.Option("--mode")] = TrainingMode.lora,
    name: Annotated[str | None, typer.Option("--name", help="Job name (default: recipe)")] = None,
    detach: Annotated[
        bool, typer.Option("--detach", help="Submit and return; follow with GET /v1/tasks/{id}.")
    ] = False,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Create a job and run a recipe on it as a managed run (needs a running `loom up`)."""
    settings = settings_for(data_dir)
    url = url or settings.gateway_url
    require_gateway(url)
    parsed = _parse_config(config)
    with LoomClient(url, api_key_for(api_key, settings)) as loom:
        try:
            job = loom.create_job(base_model, name=name or recipe, mode=mode)
        except LoomError as exc:
            fail(exc.message)
        try:
            task = job.run_recipe(recipe, parsed)
        except LoomError as exc:
            job.set_status("cancelled")  # refused before it ran: no job left waiting for it
            fail(exc.message)
        console.print(f"Job [bold]{job.id}[/bold]: recipe {recipe}, run {task.id}")
        if detach:
            return
        info = _follow(task)
    if info.status is not TaskStatus.succeeded:
        reason = info.error.message if info.error else info.status.value
        fail(f"Run {info.status.value}: {reason}")
    console.print_json(data=(info.result or {}).get("summary", {}))


def _parse_config(text: str) -> dict[str, Any]:
    try:
        raw = Path(text[1:]).read_text() if text.startswith("@") else text
        parsed = json.loads(raw)
    except (OSError, json.JSONDecodeError) as exc:
        fail(f"--config: {exc}", code=2)
    if not isinstance(parsed, dict):
        fail("--config must be a JSON object.", code=2)
    return parsed


def _follow(task: Any) -> BackgroundTask:
    """Print the run's checkpoints as they come until it ends."""
    shown: tuple[str, int | None] | None = None
    while True:
        info: BackgroundTask = task.refresh()
        now = (info.status.value, info.progress.step if info.progress else None)
        if now != shown:
            step = f", checkpoint after step {now[1]}" if now[1] is not None else ""
            console.print(f"  {info.status.value} (attempt {info.attempts}){step}")
            shown = now
        if info.done:
            return info
        time.sleep(FOLLOW_POLL_S)
