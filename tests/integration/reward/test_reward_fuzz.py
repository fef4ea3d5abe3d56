"""Schemathesis against the reward service's OpenAPI (its worker pool real): no 5xx."""

from __future__ import annotations

from services.reward.app import create_app
from services.reward.settings import RewardSettings
from tests.support.fuzz import fuzz
from tests.support.reward import reward_client


async def test_generated_requests_get_no_server_error() -> None:
    settings = RewardSettings(reward_workers=1, reward_item_timeout_s=3.0)
    async with reward_client(settings) as client:
        report = await fuzz(client, create_app(settings).openapi())
    report.check()
