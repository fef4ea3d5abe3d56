"""Single turn: `a+b=` → the sum, scored by exact match (the demo's task)."""

from __future__ import annotations

from pydantic import Field

from services.common.schemas import StrictModel
from services.rollout.environments import Environment, Scoring
from services.rollout.schemas import RolloutTask


class ArithmeticParams(StrictModel):
    chat: bool = Field(default=False, description="Wrap the prompt in the chat template")


class ArithmeticEnv(Environment):
    name = "arithmetic"
    description = "Single turn: the model completes `a+b=` with the sum; exact match."
    params_model = ArithmeticParams

    def __init__(self, params: ArithmeticParams, task: RolloutTask) -> None:
        super().__init__(params, task)
        self.chat = params.chat

    def scoring(self, replies: list[str]) -> Scoring:
        return Scoring("exact_match", replies[-1], self.task.reference, {})
