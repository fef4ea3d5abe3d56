"""`python -m services.reward` runs the reward service."""

from services.common.serve import serve
from services.reward.app import create_app
from services.reward.settings import RewardSettings

if __name__ == "__main__":
    settings = RewardSettings()
    serve("reward", lambda: create_app(settings), settings)
