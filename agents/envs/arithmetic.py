"""Single turn: `a+b=` → the sum, scored by the first integer of the reply (the demo's task)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from services.common.schemas import StrictModel
from services.rollout.environments import Environment, Scoring
from services.rollout.schemas import RolloutTask


class ArithmeticParams(StrictModel):
    chat: bool = Field(default=False, description="Wrap the prompt in the chat template")
    # first_integer: "57 and more" earns 57's reward, as a reward function that reads the
    # answer out of the text would give it; exact_match also asks the reply to stop there.
    verifier: Literal["first_integer", "exact_match"] = Field(
        default="first_integer",
        description="first_integer: the reply's first integer is the sum; exact_match: the "
        "reply is the sum and nothing else",
    )


class ArithmeticEnv(Environment):
    name = "arithmetic"
    description = (
        "Single turn: the model completes `a+b=` with the sum; scored by the "
        "reply's first integer (env_params.verifier: exact_match for the whole "
        "reply)."
    )
    params_model = ArithmeticParams

    def __init__(self, params: ArithmeticParams, task: RolloutTask) -> None:
        super().__init__(params, task)
        self.chat = params.chat
        self.verifier = params.verifier

    def scoring(self, replies: list[str]) -> Scoring:
        return Scoring(self.verifier, replies[-1], self.task.reference, {})
