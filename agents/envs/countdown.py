"""Single turn Countdown: reach a target from given numbers with + - * / (each number at
most once); the reward service's `countdown` verifier checks the expression, with this
environment's params as its own."""

from __future__ import annotations

from services.reward.countdown import CountdownParams
from services.rollout.environments import Environment, Scoring


class CountdownEnv(Environment):
    name = "countdown"
    description = (
        "Single turn: reach the target from the numbers with + - * / and "
        'parentheses; the task\'s reference is {"numbers": [...], "target": n}.'
    )
    params_model = CountdownParams
    params: CountdownParams

    def scoring(self, replies: list[str]) -> Scoring:
        return Scoring(
            "countdown", replies[-1], self.task.reference, self.params.model_dump(exclude_none=True)
        )
