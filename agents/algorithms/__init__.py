"""Client-side RL algorithms: scored groups in, trainer data out."""

from agents.algorithms.advantages import (
    dr_grpo_advantages,
    group_advantages,
    grpo_advantages,
    has_signal,
    overlong_penalty,
    rloo_advantages,
)
from agents.algorithms.algorithm import Algorithm, TrainingBatch, dapo, dr_grpo, grpo, rloo
from agents.algorithms.data import rl_datum, sft_datum, trajectory_datum

__all__ = [
    "Algorithm",
    "TrainingBatch",
    "dapo",
    "dr_grpo",
    "dr_grpo_advantages",
    "group_advantages",
    "grpo",
    "grpo_advantages",
    "has_signal",
    "overlong_penalty",
    "rl_datum",
    "rloo",
    "rloo_advantages",
    "sft_datum",
    "trajectory_datum",
]
