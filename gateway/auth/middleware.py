"""Authentication: a small ASGI middleware in front of every route but the operational ones.

It is pure ASGI so proxied streams pass through it untouched. It attaches the caller's
`KeyIdentity` to `request.state.api_key`; `auth.deps.CurrentKey` / `AdminKey` read it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from cachetools import TTLCache
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.auth.dialects import ClientDialects
from gateway.auth.keys import KeyIdentity, authenticate, hash_secret
from services.common.app_factory import database_unavailable, error_response
from services.common.db import in_transaction
from services.common.errors import Unauthorized

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json"})
PUBLIC_PREFIXES = ("/docs", "/redoc")
# The web admin authenticates with its own session cookie (gateway/admin/session.py), so the
# API-key middleware lets it through and its routes check the cookie themselves.
ADMIN_PREFIX = "/admin"
# Routes Loom's services call (a rollout replica's heartbeat) check the service token
# themselves (`gateway.auth.deps.service_caller`): a service holds no API key. Rollout's readiness
# probe there is open, as every /readyz is.
INTERNAL_PREFIX = "/v1/internal/"


def missing_key(dialects: ClientDialects) -> str:
    hints = "".join(f" ({hint})" for hint in dialects.key_hints())
    return (
        "Missing API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
        f"{hints}. `loom up` prints the admin key once and writes it to "
        "<data_dir>/admin_key."
    )


def presented_secret(headers: dict[bytes, bytes], dialects: ClientDialects) -> str | None:
    authorization = headers.get(b"authorization", b"").decode("latin-1").strip()
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    for header in dialects.key_headers():
        key = headers.get(header, b"").decode("latin-1").strip()
        if key:
            return key
    api_key = headers.get(b"x-api-key", b"").decode("latin-1").strip()
    return dialects.without_prefix(api_key) or None


def is_public(path: str) -> bool:
    return (
        path in PUBLIC_PATHS
        or path.startswith((*PUBLIC_PREFIXES, INTERNAL_PREFIX))
        or path == ADMIN_PREFIX
        or path.startswith(ADMIN_PREFIX + "/")
    )


class ApiKeyAuthMiddleware:
    """401 unless the request carries a valid, unrevoked key; public paths pass freely.
    `dialects`: how the SDK protocols the gateway serves besides Loom's present a key and
    read a refusal."""

    def __init__(self, app: ASGIApp, dialects: ClientDialects) -> None:
        self.app = app
        self.dialects = dialects

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_public(scope["path"]):
            await self.app(scope, receive, send)
            return
        secret = presented_secret(dict(scope["headers"]), self.dialects)
        if secret is None:
            await self._unauthorized(missing_key(self.dialects), scope["path"])(
                scope, receive, send
            )
            return
        state = scope["app"].state
        digest = hash_secret(secret)
        identity = state.auth_cache.get(digest)
        if identity is None:
            try:
                identity = await in_transaction(state.sessions, lambda s: authenticate(s, secret))
            except (OperationalError, InterfaceError) as exc:  # an outage: the client retries
                await database_unavailable(exc)(scope, receive, send)
                return
            if identity is not None:
                state.auth_cache.put(digest, identity)
        if identity is None:
            await self._unauthorized("Invalid or revoked API key.", scope["path"])(
                scope, receive, send
            )
            return
        scope.setdefault("state", {})["api_key"] = identity
        await self.app(scope, receive, send)

    def _unauthorized(self, message: str, path: str) -> ASGIApp:
        """A 401 in the shape the caller's SDK reads: its own under its routes, else Loom's."""
        respond = self.dialects.error_response(path)
        response = (
            respond(Unauthorized(message))
            if respond is not None
            else error_response(401, "unauthorized", message)
        )
        response.headers["WWW-Authenticate"] = "Bearer"
        return response


class AuthCache:
    """Keys that authenticated recently, by hash, so hot paths (every proxied sample call)
    skip the database. A revocation made through this gateway takes effect at once (`evict`);
    one made through another replica, within `ttl_s`. The middleware reads it on the event
    loop while sync routes evict from the threadpool: a lock keeps the two apart."""

    def __init__(
        self,
        ttl_s: float,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        # Full: the least recently used key goes; expired ones go as the cache is touched.
        self._entries: TTLCache[str, KeyIdentity] | None = (
            TTLCache(maxsize=max_entries, ttl=ttl_s, timer=clock) if ttl_s > 0 else None
        )
        self._lock = threading.Lock()

    def get(self, digest: str) -> KeyIdentity | None:
        if self._entries is None:
            return None
        with self._lock:
            return self._entries.get(digest)

    def put(self, digest: str, identity: KeyIdentity) -> None:
        if self._entries is None:
            return
        with self._lock:
            self._entries[digest] = identity

    def evict(self, key_id: str) -> None:
        if self._entries is None:
            return
        with self._lock:
            for digest in [d for d, identity in self._entries.items() if identity.id == key_id]:
                self._entries.pop(digest, None)
