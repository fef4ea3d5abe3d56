"""`python -m services.trainer`: serve the trainer (port 8004 by default)."""

from services.common.serve import serve
from services.trainer.app import create_app
from services.trainer.settings import TrainerSettings

if __name__ == "__main__":
    settings = TrainerSettings()
    serve("trainer", lambda: create_app(settings), settings)
