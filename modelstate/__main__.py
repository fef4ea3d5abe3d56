"""`python -m modelstate`: serve the model-state store (port from LOOM_MODELSTATE_URL)."""

from __future__ import annotations

from modelstate.app import create_app
from modelstate.settings import ModelStateSettings
from services.common.serve import serve


def main() -> None:
    settings = ModelStateSettings()
    serve("modelstate", lambda: create_app(settings), settings)


if __name__ == "__main__":
    main()
