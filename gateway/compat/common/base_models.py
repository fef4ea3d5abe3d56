"""The base models the SDK protocols (Tinker, Weaver) serve: the one rollout's engine runs,
under its own name and every SDK name `LOOM_GATEWAY_SDK_BASE_MODELS` maps onto it. A sampler
or a training model of any other base is refused when it is asked for, naming what is
served, instead of sampling or training something else later."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path

from services.common.errors import InvalidInput
from services.rollout.client import RolloutClient

# "Qwen/Qwen3-8B:262144": a context-length variant of a model name (Weaver's catalog)
MAX_LENGTH_SUFFIX = re.compile(r":\d+$")


@dataclass(frozen=True)
class BaseModelInfo:
    name: str  # as an SDK names it
    loom_name: str  # what Loom's trainer and rollout load
    served: bool  # rollout's engine runs it: it can be sampled and trained


class ServedModels:
    def __init__(self, rollout: RolloutClient, aliases: dict[str, str]) -> None:
        self.rollout = rollout
        self.aliases = aliases
        self._rollout_base: str | None = None  # rollout's configured base: fixed for its life
        self._lock = asyncio.Lock()

    def loom_name(self, name: str) -> str:
        """The Loom base model an SDK name stands for (unlisted names are used as given)."""
        plain = MAX_LENGTH_SUFFIX.sub("", name)
        return self.aliases.get(name, self.aliases.get(plain, plain))

    async def rollout_base(self) -> str:
        async with self._lock:
            if self._rollout_base is None:
                self._rollout_base = (await self.rollout.resident_versions()).base_model
            return self._rollout_base

    async def catalog(self) -> list[BaseModelInfo]:
        """Every base model name Loom knows, served ones first, then by name."""
        base = await self.rollout_base()
        names = {base, *self.aliases}
        found = [
            BaseModelInfo(name, self.loom_name(name), same_model(self.loom_name(name), base))
            for name in names
        ]
        return sorted(found, key=lambda m: (not m.served, m.name))

    async def check(self, name: str, what: str) -> str:
        """`name`'s Loom base model, if rollout serves it; else a 4xx naming what is."""
        loom = self.loom_name(name)
        base = await self.rollout_base()
        if same_model(loom, base):
            return loom
        served = [m.name for m in await self.catalog() if m.served]
        shown = repr(name) if loom == name else f"{name!r} (Loom's {loom!r})"
        raise InvalidInput(
            f"{what} on base model {shown}: Loom serves {served} (rollout "
            "runs one base model; LOOM_GATEWAY_SDK_BASE_MODELS maps SDK names "
            "onto it).",
            {"base_model": name, "served": served},
        )


def same_model(a: str, b: str) -> bool:
    """The same name, or two spellings of one model directory."""
    if a == b:
        return True
    first, second = Path(a).expanduser(), Path(b).expanduser()
    return first.is_dir() and second.is_dir() and first.resolve() == second.resolve()
