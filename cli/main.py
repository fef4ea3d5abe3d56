"""`loom`: run the stack locally, check it, build the tiny model, run the demo."""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import httpx2
import typer
from rich.markup import escape
from rich.panel import Panel
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from cli import runs
from cli.cluster.commands import cluster_app
from cli.common import (
    ApiKeyOption,
    DataDirOption,
    UrlOption,
    admin_key_file,
    api_key_for,
    console,
    err_console,
    fail,
    gateway_answers,
    settings_for,
)
from cli.supervisor import (
    STACK,
    RunningService,
    ServiceFailed,
    Supervisor,
    supervised_state,
    terminate_on_sigterm,
)
from cli.versions import versions_app
from gateway.schemas import StackHealth
from services.common.service_token import ServiceTokenError

app = typer.Typer(
    help="Loom: a control plane for RL post-training of LLMs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
model_app = typer.Typer(help="Model utilities.", no_args_is_help=True)
app.add_typer(model_app, name="model")
app.add_typer(versions_app, name="versions")
app.add_typer(cluster_app, name="cluster")
app.command()(runs.recipes)
app.command()(runs.run)


def _start(supervisor: Supervisor) -> None:
    """Launch the stack and show each service's way to readiness; on a start-up death, show
    the tail of its log (the supervisor's context then stops the rest)."""
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description:<11}"),
        TextColumn("{task.fields[state]}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        try:
            launched = supervisor.launch()
        except ServiceTokenError as exc:  # a token set too short, a data dir not writable
            fail(str(exc))
        tasks = {s.name: progress.add_task(s.name, total=1, state="starting") for s in launched}

        def on_change(service: RunningService) -> None:
            progress.update(tasks[service.name], completed=1, state=service.state)

        try:
            supervisor.wait_ready(on_change)
        except ServiceFailed as failure:
            state = f"[red]{escape(failure.reason)}[/red]"
            progress.update(tasks[failure.service.name], state=state)
            progress.stop()
            err_console.print(
                Panel(
                    Text(failure.service.log_tail() or "(empty log)"),
                    title=f"{failure.service.log_path} (tail)",
                )
            )
            fail(f"{failure}; stopping the stack.")


def _services_table(supervisor: Supervisor) -> Table:
    table = Table(title="Loom stack")
    for column in ("service", "URL", "pid", "state", "log"):
        table.add_column(column)
    for service in supervisor.services:
        table.add_row(
            service.name, service.url, str(service.pid), service.state, str(service.log_path)
        )
    return table


@app.command()
def up(
    data_dir: DataDirOption = None,
    only: Annotated[
        list[str] | None,
        typer.Option(
            "--only", help="Start only these services (repeatable); default: all of them."
        ),
    ] = None,
) -> None:
    """Start every service as a local process and keep them running until Ctrl-C."""
    settings = settings_for(data_dir)
    key_file = admin_key_file(settings)
    had_key = key_file.exists()
    specs = [spec for spec in STACK if not only or spec.name in only]
    unknown = set(only or ()) - {spec.name for spec in STACK}
    if unknown:
        fail(
            f"Unknown service(s) {sorted(unknown)}; known: {[spec.name for spec in STACK]}", code=2
        )
    terminate_on_sigterm()
    with Supervisor(settings, specs) as supervisor:
        try:
            _start(supervisor)
            console.print(_services_table(supervisor))
            if not had_key and key_file.exists():
                console.print(
                    Panel(
                        f"{key_file.read_text().strip()}\n\nAlso in {key_file} (mode 0600), which "
                        "`loom status` and `loom demo` read. Delete it in production.",
                        title="bootstrap admin API key (shown once)",
                    )
                )
            console.print("Stack is up. Ctrl-C stops it; a service that dies is restarted.")
            _keep_up(supervisor)
        except KeyboardInterrupt:
            console.print("Stopping the stack...")
    console.print("Stopped.")


def _keep_up(supervisor: Supervisor) -> None:
    """Restart what dies, saying so, until Ctrl-C or a service that keeps dying."""
    with httpx2.Client(timeout=2.0) as http:
        while True:
            try:
                changed = supervisor.supervise(http)
            except ServiceFailed as failure:
                err_console.print(
                    Panel(
                        Text(failure.service.log_tail() or "(empty log)"),
                        title=f"{failure.service.log_path} (tail)",
                    )
                )
                fail(f"{failure}.")
            for service in changed:
                if service.state == "waiting":
                    err_console.print(
                        Text(
                            f"{service.name} exited with code {service.last_exit}; restarting "
                            f"(log: {service.log_path})",
                            style="yellow",
                        )
                    )
                elif service.state == "ready":
                    console.print(f"{service.name} is ready again (restart {service.restarts}).")
            time.sleep(1)


def fetch_health(url: str, api_key: str) -> StackHealth:
    response = httpx2.get(
        f"{url.rstrip('/')}/v1/health", headers={"Authorization": f"Bearer {api_key}"}, timeout=10
    )
    if response.status_code != 200:
        message = response.json().get("error", {}).get("message", response.text)
        raise RuntimeError(f"HTTP {response.status_code}: {message}")
    return StackHealth.model_validate(response.json())


@app.command()
def config() -> None:
    """Print every LOOM_* setting with its default and meaning (Markdown)."""
    from cli.settings_doc import settings_markdown

    print(settings_markdown())


@app.command()
def status(
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Show each service's readiness, as the gateway sees it. Exits 1 unless all are ready."""
    settings = settings_for(data_dir)
    url = url or settings.gateway_url
    try:
        health = fetch_health(url, api_key_for(api_key, settings))
    except (httpx2.TransportError, RuntimeError) as exc:
        fail(f"Gateway at {url}: {exc}")
    supervised = supervised_state(settings)  # restarts, when `loom up` runs the stack here
    table = Table(title=f"Loom at {url}: {health.status}")
    for column in ("service", "status", "version", "restarts", "detail"):
        table.add_column(column)
    for name, service in health.services.items():
        color = "green" if service.status in ("ready", "ok") else "red"
        detail = ", ".join(f"{k}={v}" for k, v in service.detail.items())
        restarts = str(supervised.get(name, {}).get("restarts", "")) if supervised else ""
        table.add_row(
            name,
            f"[{color}]{service.status}[/{color}]",
            service.version,
            restarts,
            escape(detail[:120]),
        )
    console.print(table)
    if health.status != "ok":
        raise typer.Exit(1)


@model_app.command("tiny")
def model_tiny(directory: Annotated[Path, typer.Argument(help="Output directory.")]) -> None:
    """Build the deterministic tiny model (Qwen2-style, random init) as a Hugging Face dir."""
    from services.common.tiny_model import build_tiny_model

    path = build_tiny_model(directory)
    console.print(f"Tiny model written to {path}")


class DemoName(StrEnum):
    arith = "arith"
    python_tool = "python-tool"


def _demo_runner(name: DemoName) -> Callable[[str, str, Path], Any]:
    if name is DemoName.python_tool:
        from agents.examples.python_tool_grpo import run_demo
    else:
        from agents.examples.arith_grpo import run_demo
    return run_demo


@app.command()
def demo(
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    example: Annotated[
        DemoName,
        typer.Option(
            "--example",
            help="arith: GRPO on arithmetic (a few minutes); python-tool: multi-turn "
            "tool use, the model calls a sandboxed Python tool (about 11 minutes).",
        ),
    ] = DemoName.arith,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Where plots and metrics go (default runs/<example>_grpo)."),
    ] = None,
    data_dir: DataDirOption = None,
) -> None:
    """Train the tiny model with GRPO (starts a local stack if needed).

    Runs against the gateway at --url if one answers there; otherwise starts the local stack,
    runs the demo, and stops the stack again."""
    run_demo = _demo_runner(example)
    out = out or Path("runs") / f"{example.value.replace('-', '_')}_grpo"
    settings = settings_for(data_dir)
    url = url or settings.gateway_url
    if gateway_answers(url):
        result = run_demo(url, api_key_for(api_key, settings), out)
    elif url.rstrip("/") != settings.gateway_url.rstrip("/"):
        fail(f"No gateway answers at {url}.")
    else:
        console.print(f"No gateway at {url}: starting a local stack in {settings.data_dir}.")
        terminate_on_sigterm()
        with Supervisor(settings) as supervisor:
            _start(supervisor)
            result = run_demo(url, api_key_for(api_key, settings), out)
    console.print(f"Demo finished in {result.wall_s:.0f} s; output in {out.resolve()}")


if __name__ == "__main__":  # `python -m cli.main`
    app()
