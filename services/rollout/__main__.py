"""`python -m services.rollout`: the rollout service on its configured port (8001)."""

from services.common.serve import serve
from services.rollout.app import create_app
from services.rollout.settings import RolloutSettings

if __name__ == "__main__":  # vLLM spawns processes that re-import the main module
    settings = RolloutSettings()
    serve("rollout", lambda: create_app(settings), settings)
