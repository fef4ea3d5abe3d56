"""Web admin sessions: a signed cookie that names an API key by its id (never its secret), and
CSRF tokens derived from the session.

Cookies are stateless (itsdangerous's URL-safe signed JSON, HMAC with the gateway's admin
session secret), so any gateway replica that shares the secret can read them. Logging out
deletes the cookie and remembers the session as ended in this process until it would have
expired (a copy of the cookie replayed at another replica stays valid until then); revoking
the key ends every session made with it everywhere, since each request re-reads the key row
(see `access.py`). Each use of the secret is domain-separated (cookie signature vs CSRF
token, session vs login cookie: itsdangerous's salts), so one can never stand in for another.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from itsdangerous import BadData, Signer, URLSafeSerializer

from gateway.settings import GatewaySettings

SESSION_COOKIE = "loom_admin"
# Before login there is no session to derive a CSRF token from, so the login form gets its
# own short-lived signed nonce (a "pre-session"), which stops login CSRF too.
LOGIN_COOKIE = "loom_admin_login"
LOGIN_TTL_S = 3600.0
CSRF_FIELD = "csrf_token"

_SESSION, _LOGIN = "session", "login"


@dataclass(frozen=True)
class AdminSession:
    key_id: str
    session_id: str
    issued_at: float


class SessionSigner:
    """Issues and reads admin cookies and CSRF tokens with one secret, and remembers the
    sessions logged out before their expiry."""

    def __init__(self, secret: bytes, ttl_s: float, clock: Callable[[], float] = time.time) -> None:
        if len(secret) < 16:
            raise ValueError("the admin session secret needs at least 16 bytes")
        # HMAC-SHA256 (itsdangerous defaults to SHA-1).
        self._cookies = {
            purpose: URLSafeSerializer(
                secret,
                salt=f"loom-admin-{purpose}-cookie",
                signer_kwargs={"digest_method": hashlib.sha256},
            )
            for purpose in (_SESSION, _LOGIN)
        }
        self._csrf = Signer(secret, salt="loom-admin-csrf", digest_method=hashlib.sha256)
        self.ttl_s = ttl_s
        self._clock = clock
        self._ended: dict[str, float] = {}  # session id -> when its cookie expires anyway

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> SessionSigner:
        configured = settings.gateway_admin_session_secret
        # No configured secret: a random one per process, so sessions end at restart (the
        # documented trade-off; replicas behind one balancer must configure a shared one).
        secret = (
            configured.get_secret_value().encode("utf-8")
            if configured is not None
            else secrets.token_bytes(32)
        )
        return cls(secret, settings.gateway_admin_session_ttl_s)

    # --- sessions ---------------------------------------------------------------------------

    def issue(self, key_id: str) -> tuple[AdminSession, str]:
        """A new session for `key_id` and the cookie value that carries it."""
        session = AdminSession(
            key_id=key_id, session_id=secrets.token_urlsafe(16), issued_at=self._clock()
        )
        payload = {"k": key_id, "s": session.session_id, "t": session.issued_at}
        return session, self._cookies[_SESSION].dumps(payload)

    def read(self, cookie: str | None) -> AdminSession | None:
        """The session a cookie carries, or None when it is missing, forged or expired."""
        payload = self._verify(cookie, _SESSION, self.ttl_s)
        if payload is None or not isinstance(payload.get("k"), str) or payload["s"] in self._ended:
            return None
        return AdminSession(key_id=payload["k"], session_id=payload["s"], issued_at=payload["t"])

    def end(self, session: AdminSession) -> None:
        """Log a session out: its cookie is refused from now on, even if replayed."""
        now = self._clock()
        self._ended = {sid: until for sid, until in self._ended.items() if until > now}
        self._ended[session.session_id] = session.issued_at + self.ttl_s

    # --- the login form's pre-session -------------------------------------------------------

    def issue_login_nonce(self) -> tuple[str, str]:
        """A nonce for the login form and the cookie value that carries it."""
        nonce = secrets.token_urlsafe(16)
        return nonce, self._cookies[_LOGIN].dumps({"s": nonce, "t": self._clock()})

    def read_login_nonce(self, cookie: str | None) -> str | None:
        payload = self._verify(cookie, _LOGIN, LOGIN_TTL_S)
        return None if payload is None else payload["s"]

    # --- CSRF -------------------------------------------------------------------------------

    def csrf_token(self, session_id: str) -> str:
        """The token every state-changing form of this session must carry."""
        return self._csrf.get_signature(session_id).decode("ascii")

    def csrf_valid(self, session_id: str, token: str | None) -> bool:
        # verify_signature compares in constant time.
        return bool(token) and self._csrf.verify_signature(
            session_id, (token or "").encode("utf-8", "replace")
        )

    # --- reading cookies --------------------------------------------------------------------

    def _verify(self, value: str | None, purpose: str, max_age_s: float) -> dict[str, Any] | None:
        """The payload of a cookie signed for `purpose` and younger than `max_age_s`."""
        if not value:
            return None
        try:
            payload = self._cookies[purpose].loads(value)
        except BadData:  # forged, tampered, another purpose's or not ours at all
            return None
        if not isinstance(payload, dict) or not isinstance(payload.get("s"), str):
            return None
        issued = payload.get("t")
        if not isinstance(issued, int | float):
            return None
        age = self._clock() - issued
        return payload if 0 <= age <= max_age_s else None


def same_origin(origin: str | None, host: str | None) -> bool:
    """Whether a browser's `Origin` header names the host the request was sent to.

    Browsers send Origin on every cross-site POST, so a forged form from another site fails
    here even before its CSRF token is looked at. A missing Origin (older clients, some
    same-origin navigations) is allowed: the CSRF token still has to match. Only the host and
    port are compared, since a TLS-terminating proxy in front may change the scheme.
    """
    if origin is None:
        return True
    if not host or origin == "null":
        return False
    return urlsplit(origin).netloc.lower() == host.lower()
