"""Who is looking at the admin, and whether a form may change anything.

`ViewerDep` reads the session cookie and re-reads its key (revoked: back to the login page);
`CheckedForm` additionally refuses a POST whose CSRF token or Origin does not match.
`AdminRoute` turns what these raise, and Loom's own errors, into HTML answers, since a browser
should get a page rather than the JSON envelope the API gives.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.datastructures import FormData
from starlette.responses import Response

from gateway.admin.session import (
    CSRF_FIELD,
    LOGIN_COOKIE,
    LOGIN_TTL_S,
    SESSION_COOKIE,
    AdminSession,
    SessionSigner,
    same_origin,
)
from gateway.admin.templating import login_redirect, render_error
from gateway.auth.keys import KeyIdentity, active_identity, authenticate
from services.common.db import in_transaction
from services.common.errors import LoomError

CSRF_HEADER = "x-csrf-token"  # htmx requests send the token as a header (see base.html)


class LoginRequired(Exception):
    """No valid session (none, forged, expired, or its key was revoked)."""


class CsrfRefused(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Viewer:
    key: KeyIdentity
    session: AdminSession
    csrf: str


def signer_of(request: Request) -> SessionSigner:
    signer: SessionSigner = request.app.state.admin_signer
    return signer


async def current_viewer(request: Request) -> Viewer:
    signer = signer_of(request)
    session = signer.read(request.cookies.get(SESSION_COOKIE))
    if session is None:
        raise LoginRequired
    # One primary-key read per page: cheap, and a revoked key stops working at once.
    key = await in_transaction(
        request.app.state.sessions, lambda s: active_identity(s, session.key_id)
    )
    if key is None:
        raise LoginRequired
    viewer = Viewer(key=key, session=session, csrf=signer.csrf_token(session.session_id))
    request.state.admin_viewer = viewer  # templates show who is logged in
    return viewer


ViewerDep = Annotated[Viewer, Depends(current_viewer)]


async def checked_form(request: Request, viewer: ViewerDep) -> FormData:
    """The posted form, once its Origin and CSRF token have been checked."""
    check_origin(request)
    form = await request.form()
    token = form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER)
    if not isinstance(token, str) or not signer_of(request).csrf_valid(
        viewer.session.session_id, token
    ):
        raise CsrfRefused(
            "This form's CSRF token is missing or does not belong to your "
            "session, so nothing was changed. Reload the page and try again."
        )
    return form


CheckedForm = Annotated[FormData, Depends(checked_form)]


def check_origin(request: Request) -> None:
    if not same_origin(request.headers.get("origin"), request.headers.get("host")):
        raise CsrfRefused(
            f"The request came from another site "
            f"({request.headers.get('origin')}), so nothing was changed."
        )


# --- logging in and out ---------------------------------------------------------------------


def login_form_token(request: Request) -> tuple[str, str | None]:
    """The login form's CSRF token, and the pre-session cookie it is bound to when a new one
    must be set (`set_login_cookie`); a browser that has a valid one keeps it."""
    signer = signer_of(request)
    nonce = signer.read_login_nonce(request.cookies.get(LOGIN_COOKIE))
    cookie = None
    if nonce is None:
        nonce, cookie = signer.issue_login_nonce()
    return signer.csrf_token(nonce), cookie


def set_login_cookie(request: Request, response: Response, cookie: str | None) -> None:
    if cookie is not None:
        _set_cookie(request, response, LOGIN_COOKIE, cookie, LOGIN_TTL_S)


def check_login_form(request: Request, token: str | None) -> None:
    check_origin(request)
    nonce = signer_of(request).read_login_nonce(request.cookies.get(LOGIN_COOKIE))
    if nonce is None or not signer_of(request).csrf_valid(nonce, token):
        raise CsrfRefused(
            "The login form expired or was not sent from this site. "
            "Reload the login page and try again."
        )


async def log_in(request: Request, response: Response, secret: str) -> KeyIdentity | None:
    """Check an API key; when valid, set the session cookie (the key's id, signed)."""
    key = await in_transaction(
        request.app.state.sessions, lambda s: authenticate(s, secret.strip())
    )
    if key is None:
        return None
    _, cookie = signer_of(request).issue(key.id)
    _set_cookie(request, response, SESSION_COOKIE, cookie, signer_of(request).ttl_s)
    _clear_cookie(request, response, LOGIN_COOKIE)
    return key


def log_out(request: Request, response: Response, viewer: Viewer) -> None:
    signer_of(request).end(viewer.session)
    _clear_cookie(request, response, SESSION_COOKIE)


def _set_cookie(
    request: Request, response: Response, name: str, value: str, max_age_s: float
) -> None:
    # HttpOnly: no script can read it; SameSite=Strict: no other site's page can make the
    # browser send it; Secure whenever the admin is reached over TLS (a proxy in front must
    # pass X-Forwarded-Proto for that).
    response.set_cookie(
        name,
        value,
        max_age=int(max_age_s),
        path="/admin",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def _clear_cookie(request: Request, response: Response, name: str) -> None:
    response.delete_cookie(
        name, path="/admin", httponly=True, samesite="strict", secure=request.url.scheme == "https"
    )


class AdminRoute(APIRoute):
    """Answers with HTML: a redirect to the login page, or an error page with the status."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except LoginRequired:
                return login_redirect(request)
            except CsrfRefused as exc:
                return render_error(request, 403, "Request refused", exc.message)
            except RequestValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}"
                    for e in exc.errors()[:5]
                )
                return render_error(request, 422, "Invalid input", problems)
            except LoomError as exc:
                return render_error(request, exc.status_code, _title(exc), exc.message)

        return guarded


def _title(exc: LoomError) -> str:
    return exc.code.replace("_", " ").capitalize()
