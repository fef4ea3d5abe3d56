"""Training rows for trainer tests: uneven lengths, with sampler logprobs and advantages."""

from __future__ import annotations

import random

from services.trainer.schemas import Datum

LONG_TAILED = (1, 2, 3, 5, 8, 13, 60)


def long_tailed_data(
    count: int, seed: int = 0, completions: tuple[int, ...] = LONG_TAILED
) -> list[Datum]:
    """Prompt of 4 tokens, completions of one of `completions` tokens, with sampler logprobs
    and advantages."""
    rng = random.Random(seed)
    data = []
    for _ in range(count):
        completion = rng.choice(completions)
        ids = [rng.randrange(3, 200) for _ in range(4 + completion)]
        mask = [0.0] * 4 + [1.0] * completion
        advantage = rng.uniform(-1, 1)
        data.append(
            Datum(
                input_ids=ids,
                loss_mask=mask,
                logprobs=[0.0] * 4 + [rng.uniform(-6, -4) for _ in range(completion)],
                advantages=[advantage * m for m in mask],
            )
        )
    return data
