"""Client-side RL algorithms: scored groups in, trainer data out."""

from agents.algorithms.advantages import group_advantages, has_signal
from agents.algorithms.data import rl_datum, sft_datum

__all__ = ["group_advantages", "has_signal", "rl_datum", "sft_datum"]
