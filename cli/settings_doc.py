"""The configuration reference: every `LOOM_*` variable of every service, as a Markdown table.

`loom config` prints it; a test keeps the README's copy identical, so the docs cannot drift.
It reads every service's settings class, so it sits in the CLI, above them all."""

from __future__ import annotations

from pathlib import Path

from gateway.settings import GatewaySettings
from modelstate.settings import ModelStateSettings
from services.common.settings import LoomSettings
from services.reward.settings import RewardSettings
from services.rollout.settings import RolloutSettings
from services.sandbox.settings import SandboxSettings
from services.trainer.settings import TrainerSettings
from services.worker.settings import WorkerSettings

SETTINGS_CLASSES: tuple[type[LoomSettings], ...] = (
    LoomSettings,
    GatewaySettings,
    ModelStateSettings,
    RolloutSettings,
    TrainerSettings,
    RewardSettings,
    SandboxSettings,
    WorkerSettings,
)


def settings_rows() -> list[tuple[str, str, str]]:
    """(variable, default, description) for each setting, shared ones first, no repeats."""
    rows: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for cls in SETTINGS_CLASSES:
        own = (
            LoomSettings.model_fields
            if cls is LoomSettings
            else {k: v for k, v in cls.model_fields.items() if k not in LoomSettings.model_fields}
        )
        for name, field in own.items():
            if name in seen:
                continue
            seen.add(name)
            default = _default_text(field.default, field.default_factory)
            rows.append((f"LOOM_{name.upper()}", default, (field.description or "").strip()))
    return rows


def _default_text(default: object, factory: object) -> str:
    if factory is not None:
        return "(derived)"
    if isinstance(default, Path):
        return (
            "~/" + str(default.relative_to(Path.home()))
            if default.is_relative_to(Path.home())
            else str(default)
        )
    return "" if default is None else str(default)


def settings_markdown() -> str:
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for variable, default, description in settings_rows():
        cell = description.replace("|", "\\|").replace("\n", " ")
        lines.append(
            f"| `{variable}` | `{default}` | {cell} |"
            if default
            else f"| `{variable}` | | {cell} |"
        )
    return "\n".join(lines)
