"""The bootstrap admin key created at first start, so an admin can always get in."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from gateway.auth.keys import count_keys, create_key, key_exists
from gateway.settings import GatewaySettings
from services.common.db import transaction


def bootstrap_admin_key(sessions: sessionmaker[Session], settings: GatewaySettings) -> str | None:
    """Make sure an admin can get in. Returns the secret when one was generated just now.

    A configured `gateway_admin_key` is registered if missing. Otherwise, with no key at all,
    a random admin key is created, printed once and (by default) written to the data dir.
    """
    configured = settings.gateway_admin_key
    with transaction(sessions) as session:
        if configured is not None:
            if not key_exists(session, configured.get_secret_value()):
                create_key(
                    session, "admin (configured)", admin=True, secret=configured.get_secret_value()
                )
            return None
        if count_keys(session) > 0:
            return None
        secret = create_key(session, "bootstrap admin", admin=True).key
        # Inside the transaction: if the key cannot be shown or saved, it is not kept either.
        _announce(secret, settings)
    return secret


def _announce(secret: str, settings: GatewaySettings) -> None:
    where = "not written to disk (gateway_write_admin_key_file is off)"
    if settings.gateway_write_admin_key_file:
        write_secret_file(settings.admin_key_file, secret)
        where = f"also written to {settings.admin_key_file} (mode 0600): delete it in production"
    lines = ["Loom gateway: bootstrap admin API key (shown once)", "", secret, "", where]
    width = max(len(line) for line in lines) + 2
    box = [
        "+" + "-" * width + "+",
        *(f"| {line.ljust(width - 2)} |" for line in lines),
        "+" + "-" * width + "+",
    ]
    print("\n".join(box), file=sys.stderr, flush=True)


def write_secret_file(path: Path, secret: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)  # the file may have existed with looser bits
        handle.write(secret + "\n")
