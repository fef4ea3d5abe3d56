"""The gateway's web admin at `/admin`: server-rendered pages (Jinja2) over the same data
functions as the API, with htmx for live updates and uPlot for charts (both vendored under
`static/vendor`, see its README). Logins use an API key; the session is a signed cookie."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from gateway.admin.routes import router
from gateway.admin.session import SessionSigner
from gateway.admin.templating import STATIC_DIR
from gateway.settings import GatewaySettings

__all__ = ["install_admin", "router"]


def install_admin(app: FastAPI, settings: GatewaySettings) -> None:
    """Mount the admin on the gateway app: its pages, its static files, its session signer."""
    app.state.admin_signer = SessionSigner.from_settings(settings)
    app.include_router(router)
    app.mount("/admin/static", StaticFiles(directory=STATIC_DIR), name="admin-static")
