"""The environment plugin interface, and the registry of environments.

An environment turns a task into a conversation, answers each model turn (tool results,
feedback) until the episode is over, and names how the episode is scored. One instance plays
one episode, so an environment with state keeps it on `self`. The agent loop in
the rollout service owns everything else: tokens, chat-template rendering, sampling, turn and
token limits, loss masks, versions and calling the reward service.

An environment subclasses `Environment` and is registered under the `loom.environments`
entry-point group of its distribution (`name = "package.module:EnvironmentClass"`). Loom's
own (`agents/envs`: arithmetic, countdown, python_tool) register the same way, in Loom's
pyproject.toml; a third-party one may not shadow them. The rollout service finds them all
through the entry points, so it never imports the agents layer above it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from typing import Any, ClassVar, Protocol

from services.common.schemas import StrictModel
from services.rollout.schemas import RolloutTask
from services.sandbox.schemas import ExecuteResponse

Message = dict[str, Any]  # {"role": ..., "content": ...}, as chat templates take them


class NoParams(StrictModel):
    pass


class Tools(Protocol):
    """What the agent loop lends an environment to act on the world."""

    async def run_python(self, code: str, *, timeout_s: float) -> ExecuteResponse: ...


@dataclass(frozen=True)
class Scoring:
    """How the reward service scores one episode: `verifier` with `params` on `response`."""

    verifier: str
    response: str
    reference: str | None
    params: dict[str, Any]


class Environment(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    params_model: ClassVar[type[StrictModel]] = NoParams
    max_turns: ClassVar[int] = 1  # model turns, unless the request says otherwise
    # False: the task's text is the whole prompt, with no chat template (base models and
    # the tiny model, which learnt raw text). An environment may set it per instance.
    chat: bool = True

    def __init__(self, params: StrictModel, task: RolloutTask) -> None:
        self.params = params
        self.task = task

    def tools(self) -> list[dict[str, Any]]:
        """Tool schemas (OpenAI function format) the chat template shows the model."""
        return []

    def messages(self) -> list[Message]:
        """The conversation the model continues (chat environments)."""
        if isinstance(self.task.prompt, str):
            return [{"role": "user", "content": self.task.prompt}]
        return [m.model_dump() for m in self.task.prompt]

    def prompt_text(self) -> str:
        """The whole prompt (environments with `chat = False`)."""
        if not isinstance(self.task.prompt, str):
            raise ValueError(f"the {self.name} environment takes text prompts, not messages")
        return self.task.prompt

    def done(self, reply: str) -> bool:
        """Whether this model turn ends the episode (single-turn environments: always)."""
        return True

    async def step(self, reply: str, tools: Tools) -> list[Message]:
        """The environment's answer to a model turn that did not end the episode, as
        messages (tool results, feedback)."""
        raise NotImplementedError(f"{self.name} is single-turn: every reply ends it")

    @abstractmethod
    def scoring(self, replies: list[str]) -> Scoring:
        """How to score an episode, given the model's turns as text."""


ENTRY_POINT_GROUP = "loom.environments"
BUILTIN_DISTRIBUTION = "loom"  # whose environments no plugin may shadow


@cache
def environments() -> dict[str, type[Environment]]:
    """Every registered environment by name, Loom's own first: a plugin may not shadow one."""
    points = sorted(
        entry_points(group=ENTRY_POINT_GROUP),
        key=lambda point: point.dist is None or point.dist.name != BUILTIN_DISTRIBUTION,
    )
    found: dict[str, type[Environment]] = {}
    for point in points:
        if point.name not in found:
            found[point.name] = point.load()
    return found
