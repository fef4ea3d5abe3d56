"""Environments for agentic rollouts: the built-ins and any registered under the
`loom.environments` entry-point group (`name = "package.module:EnvironmentClass"`)."""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points

from agents.envs.arithmetic import ArithmeticEnv
from agents.envs.base import Environment, Message, Scoring, Tools
from agents.envs.countdown import CountdownEnv
from agents.envs.python_tool import PythonToolEnv

ENTRY_POINT_GROUP = "loom.environments"
BUILTIN: tuple[type[Environment], ...] = (ArithmeticEnv, CountdownEnv, PythonToolEnv)


@cache
def environments() -> dict[str, type[Environment]]:
    """Every environment by name; a plugin may not shadow a built-in."""
    found = {env.name: env for env in BUILTIN}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name not in found:
            found[entry.name] = entry.load()
    return found


__all__ = ["Environment", "Message", "Scoring", "Tools", "environments"]
