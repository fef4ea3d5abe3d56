"""The service token: the one credential every internal service asks of its callers.

Internal services (rollout, reward, sandbox, trainer, modelstate) trust whoever calls them to
have checked the user already: the gateway checks API keys and job scopes, then forwards. So a
process that could open a TCP connection to a service port (another user on the host, a
container on the compose network) could skip the gateway. The token closes that door: every
route but `/healthz`, `/readyz` and `/metrics` wants it (`ServiceTokenMiddleware` in
`services.common.app_factory`), and every Loom caller sends it: `service_headers` is the one
place the header is made, used by `client_of` (the services' typed clients) and the gateway's
upstream clients.

The header is `X-Loom-Service-Token`, not `Authorization`: the gateway takes users' keys in
`Authorization`/`X-API-Key` and must never forward them, and one header per credential keeps
a user key and the service token from ever being mistaken for each other. The gateway's
proxy drops any client-sent copy and adds its own.

Where the token comes from, first match wins:
1. `LOOM_SERVICE_TOKEN` (a cluster's secret store, say);
2. `LOOM_SERVICE_TOKEN_FILE`: read from that file, which is created if missing;
3. `<data_dir>/service_token`, created at first start.
A created file is 0600 and appears atomically (`os.link` of a complete temp file), so processes
that start at once all end up with the first one's token.
"""

from __future__ import annotations

import os
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Any, TypeVar

from services.common.http import ServiceClient
from services.common.settings import LoomSettings

SERVICE_TOKEN_HEADER = "X-Loom-Service-Token"
TOKEN_FILE_NAME = "service_token"
# Shorter tokens are guessable by a patient local process; the generated ones have 256 bits.
MIN_TOKEN_CHARS = 16

ClientT = TypeVar("ClientT", bound=ServiceClient)


class ServiceTokenError(RuntimeError):
    """No usable token: a service must not start open, nor a client start without one."""


def service_token(settings: LoomSettings) -> str:
    """This deployment's token, created on first use when no setting gives one."""
    if settings.service_token is not None:
        return _checked(settings.service_token.get_secret_value(), "LOOM_SERVICE_TOKEN")
    path = token_file(settings)
    setting = "LOOM_SERVICE_TOKEN_FILE" if settings.service_token_file else "LOOM_DATA_DIR"
    try:
        token = _read(path) if path.exists() else _create_once(path)
    except OSError as exc:
        raise ServiceTokenError(
            f"Cannot read or create the service token file {path} ({setting}): {exc}"
        ) from exc
    return _checked(token, f"{setting} ({path})")


def token_file(settings: LoomSettings) -> Path:
    """The file the token is read from (or created in) when LOOM_SERVICE_TOKEN is not set."""
    return settings.service_token_file or settings.data_dir / TOKEN_FILE_NAME


def service_headers(settings: LoomSettings) -> dict[str, str]:
    """The header that authenticates a request to an internal service."""
    return {SERVICE_TOKEN_HEADER: service_token(settings)}


def token_environment(settings: LoomSettings) -> dict[str, str]:
    """What a child process needs in its environment to use the same token as `settings`.

    The file's path, not the token, when there is one: a service's environment may reach the
    programs it starts (a sandbox's), and a path names nothing they can read."""
    token = service_token(settings)  # checked, and created now rather than by racing children
    if settings.service_token is not None:
        return {"LOOM_SERVICE_TOKEN": token}
    return {"LOOM_SERVICE_TOKEN_FILE": str(token_file(settings))}


def client_of(settings: LoomSettings, client: type[ClientT], **options: Any) -> ClientT:
    """A service's typed client (`client.SERVICE`), at its URL setting, sending the service
    token."""
    return client(settings.url_of(client.SERVICE), headers=service_headers(settings), **options)


def _read(path: Path) -> str:
    return path.read_text().strip()


def _checked(token: str, source: str) -> str:
    if len(token) < MIN_TOKEN_CHARS:
        raise ServiceTokenError(
            f"The service token from {source} is shorter than {MIN_TOKEN_CHARS} characters."
        )
    return token


def _create_once(path: Path) -> str:
    """Write a fresh token to `path` unless another process did first; return the one there.

    The temp file is complete (and 0600, as `mkstemp` makes it) before `os.link` gives it its
    name, and `link` fails rather than replace: a reader never sees a partial token and two
    writers never both win."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(token + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temp, path)
        except FileExistsError:
            return _read(path)
    finally:
        os.unlink(temp)
    return token


def main() -> int:
    """`python -m services.common.service_token`: make sure the token file exists (compose's
    one-shot init does this once, before any service starts)."""
    try:
        service_token(LoomSettings())
    except ServiceTokenError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
