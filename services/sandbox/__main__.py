"""`python -m services.sandbox` runs the sandbox service."""

from services.common.serve import serve
from services.sandbox.app import create_app
from services.sandbox.settings import SandboxSettings

if __name__ == "__main__":
    settings = SandboxSettings()
    serve("sandbox", lambda: create_app(settings), settings)
