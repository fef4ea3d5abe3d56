"""What the `loom` commands share: the options for reaching a gateway, settings, consoles."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import httpx2
import typer
from rich.console import Console
from rich.text import Text

from services.common.settings import LoomSettings

console = Console()
err_console = Console(stderr=True)

DataDirOption = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        envvar="LOOM_DATA_DIR",
        help="Where the embedded stack keeps state (default: ~/.loom).",
    ),
]
UrlOption = Annotated[
    str | None, typer.Option("--url", help="Gateway URL (default: LOOM_GATEWAY_URL).")
]
ApiKeyOption = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="LOOM_API_KEY",
        help="API key (default: <data_dir>/admin_key, written at first `loom up`).",
    ),
]


def fail(message: str, code: int = 1) -> NoReturn:
    """Print `message` in red on stderr (as is: brackets in a server's message are not markup)
    and end the command with exit status `code`."""
    err_console.print(Text(message, style="red"))
    raise typer.Exit(code)


def settings_for(data_dir: Path | None) -> LoomSettings:
    return LoomSettings(data_dir=data_dir) if data_dir else LoomSettings()


def admin_key_file(settings: LoomSettings) -> Path:
    return settings.data_dir / "admin_key"


def api_key_for(given: str | None, settings: LoomSettings) -> str:
    if given:
        return given
    key_file = admin_key_file(settings)
    if key_file.exists():
        return key_file.read_text().strip()
    fail(
        f"No API key: pass --api-key, set LOOM_API_KEY, or run `loom up` once so {key_file} "
        "exists.",
        code=2,
    )


def gateway_answers(url: str) -> bool:
    try:
        return httpx2.get(f"{url.rstrip('/')}/healthz", timeout=2).status_code == 200
    except httpx2.TransportError:
        return False


def require_gateway(url: str) -> None:
    """End the command (exit status 1) unless a gateway answers at `url`."""
    if not gateway_answers(url):
        fail(f"No gateway answers at {url}: start the stack with `loom up`.")
