"""`python -m gateway`: serve the gateway on its URL setting (default 127.0.0.1:8000)."""

from gateway.app import create_app
from gateway.settings import GatewaySettings
from services.common.serve import serve


def main() -> None:
    settings = GatewaySettings()
    serve("gateway", lambda: create_app(settings), settings)


if __name__ == "__main__":
    main()
