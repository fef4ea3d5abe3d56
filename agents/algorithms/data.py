"""Turn prompts, samples, trajectories and advantages into the trainer's `Datum` (per-token
aligned: position i describes predicting token i, so prompt positions carry no loss)."""

from __future__ import annotations

from collections.abc import Sequence

from services.rollout.schemas import Sample, TokenTrajectory
from services.trainer.schemas import Datum


def sft_datum(prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> Datum:
    """Supervised example: learn the completion given the prompt."""
    return Datum(
        input_ids=[*prompt_ids, *completion_ids],
        loss_mask=[0.0] * len(prompt_ids) + [1.0] * len(completion_ids),
    )


def rl_datum(prompt_ids: Sequence[int], sample: Sample, advantage: float) -> Datum:
    """Policy-gradient example: the sampled tokens, their sampling logprobs, one advantage."""
    n_prompt, n_completion = len(prompt_ids), len(sample.token_ids)
    return Datum(
        input_ids=[*prompt_ids, *sample.token_ids],
        loss_mask=[0.0] * n_prompt + [1.0] * n_completion,
        advantages=[0.0] * n_prompt + [advantage] * n_completion,
        logprobs=[0.0] * n_prompt + list(sample.logprobs),
    )


def trajectory_datum(trajectory: TokenTrajectory, advantage: float) -> Datum:
    """A multi-turn trajectory (a rollout's or a captured agent's segment): only the model's
    tokens (loss mask 1) are trained; tool and environment tokens are context."""
    n_prompt = len(trajectory.prompt_token_ids)
    mask = [float(m) for m in trajectory.loss_mask]
    return Datum(
        input_ids=[*trajectory.prompt_token_ids, *trajectory.token_ids],
        loss_mask=[0.0] * n_prompt + mask,
        advantages=[0.0] * n_prompt + [advantage * m for m in mask],
        logprobs=[0.0] * n_prompt + list(trajectory.logprobs),
    )
