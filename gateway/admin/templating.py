"""Rendering admin pages: one Jinja2 environment, the security headers every page carries,
and the two answers every route may give instead of its page (go log in, or an error page)."""

from __future__ import annotations

import functools
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from gateway.formatting import human_size

ADMIN_DIR = Path(__file__).resolve().parent
TEMPLATES_DIR = ADMIN_DIR / "templates"
STATIC_DIR = ADMIN_DIR / "static"
LOGIN_PATH = "/admin/login"

# Scripts only from our own static files (htmx and uPlot are vendored, chart data travels as
# JSON, not as script), nothing may frame the admin, and forms post only back to it.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; "
    "form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    # Pages show what a key may see: never keep them in a shared cache or the back/forward
    # cache after logout.
    "Cache-Control": "no-store",
}


@functools.cache
def templates() -> Jinja2Templates:
    environment = Jinja2Templates(directory=TEMPLATES_DIR)
    environment.env.filters.update(ago=ago, size=human_size, number=number)
    return environment


def render(
    request: Request, name: str, context: dict[str, Any], status_code: int = 200
) -> HTMLResponse:
    viewer = getattr(request.state, "admin_viewer", None)
    response = templates().TemplateResponse(
        request,
        name,
        {"viewer": viewer, **context},
        status_code=status_code,
    )
    response.headers.update(SECURITY_HEADERS)
    return response


def render_error(request: Request, status_code: int, title: str, message: str) -> HTMLResponse:
    return render(
        request,
        "error.html",
        {"title": title, "message": message, "status_code": status_code},
        status_code,
    )


def login_redirect(request: Request) -> Response:
    """Send an unauthenticated browser to the login page, and back afterwards to the page it
    was on (not to a fragment an htmx poll asked for, nor to a form's POST target)."""
    htmx = request.headers.get("hx-request") == "true"
    if htmx:
        back = urlsplit(request.headers.get("hx-current-url", "")).path
    else:
        back = request.url.path if request.method == "GET" else "/admin/"
    target = f"{LOGIN_PATH}?next={quote(safe_next(back), safe='/')}"
    if htmx:
        # An htmx poll would swap the login page into a fragment; ask htmx to navigate instead.
        return Response(status_code=200, headers={"HX-Redirect": target})
    return RedirectResponse(target, status_code=303)


def safe_next(target: str | None) -> str:
    """Where to go after login: only a path inside the admin, never another site."""
    if (
        target
        and (target == "/admin" or target.startswith("/admin/"))
        and "//" not in target
        and "\\" not in target
    ):
        return target
    return "/admin/"


# --- filters --------------------------------------------------------------------------------


def ago(moment: datetime | None, now: datetime | None = None) -> str:
    if moment is None:
        return "never"
    seconds = max(0.0, ((now or datetime.now(UTC)) - moment).total_seconds())
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return f"{int(seconds)} s ago"


def number(value: float | None) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return f"{value:.4g}"
