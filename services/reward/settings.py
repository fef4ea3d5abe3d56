"""Reward service settings (`LOOM_REWARD_*`)."""

from __future__ import annotations

from pydantic import Field

from services.common.settings import LoomSettings


class RewardSettings(LoomSettings):
    reward_workers: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Worker processes for math (also how many math items are scored at once "
        "across all requests), and threads for regex batches.",
    )
    reward_item_timeout_s: float = Field(
        default=20.0,
        gt=0,
        description="Deadline for one item (in a worker or the sandbox); "
        "past it the item gets reward 0 with an error (a stuck worker is replaced).",
    )
    reward_sandbox_concurrency: int = Field(
        default=8,
        ge=1,
        le=256,
        description="Sandbox executions the code and python verifiers run at once.",
    )
