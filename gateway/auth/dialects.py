"""How SDK protocols besides Loom's own present an API key and read a refusal. Auth knows
none of them: each compatibility layer registers its own (`gateway.compat.install`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from starlette.responses import Response

from services.common.errors import LoomError


@dataclass(frozen=True)
class ClientDialect:
    key_header: bytes | None = None  # a header of its own that holds the key as it is
    key_prefix: str = ""  # what its SDK puts before the key in X-API-Key
    path_prefix: str | None = None  # its routes: refusals under it take its error shape
    error_response: Callable[[LoomError], Response] | None = None
    key_hint: str = ""  # how its SDK is given a key, for the missing-key message


class ClientDialects:
    def __init__(self) -> None:
        self._dialects: list[ClientDialect] = []

    def register(self, dialect: ClientDialect) -> None:
        self._dialects.append(dialect)

    def key_headers(self) -> list[bytes]:
        return [d.key_header for d in self._dialects if d.key_header is not None]

    def without_prefix(self, api_key: str) -> str:
        """X-API-Key's value without the prefix an SDK put before the key."""
        for dialect in self._dialects:
            if dialect.key_prefix and api_key.startswith(dialect.key_prefix):
                return api_key.removeprefix(dialect.key_prefix)
        return api_key

    def key_hints(self) -> list[str]:
        return [d.key_hint for d in self._dialects if d.key_hint]

    def error_response(self, path: str) -> Callable[[LoomError], Response] | None:
        """The error shape of the SDK whose routes `path` is under (None: Loom's own)."""
        return next(
            (
                d.error_response
                for d in self._dialects
                if d.path_prefix is not None
                and d.error_response is not None
                and path.startswith(d.path_prefix)
            ),
            None,
        )
