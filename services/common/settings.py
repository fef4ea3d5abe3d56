"""Settings shared by every service: `LOOM_*` environment variables via pydantic-settings.

Each service subclasses `LoomSettings` with its own fields (named `<service>_<field>`, so the
variable is `LOOM_<SERVICE>_<FIELD>`). Build settings in `create_app` or a cached getter,
never at import time.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

_URL_HELP = "Where the service is reached; it also binds to this URL's host and port."
SERVICES = ("gateway", "rollout", "reward", "sandbox", "trainer", "modelstate")


class LoomSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LOOM_", extra="ignore")

    data_dir: Path = Field(
        default=Path.home() / ".loom", description="Where embedded state lives (db, blobs)."
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL, e.g. postgresql+psycopg://postgres@127.0.0.1/loom. "
        "Default: a SQLite file per service under data_dir.",
    )
    log_level: str = Field(default="info", description="debug | info | warning | error")
    service_token: SecretStr | None = Field(
        default=None,
        description="The credential internal services ask of every caller (header "
        "X-Loom-Service-Token; all routes but /healthz, /readyz, /metrics). Give every "
        "process of one Loom the same. Default: LOOM_SERVICE_TOKEN_FILE.",
    )
    service_token_file: Path | None = Field(
        default=None,
        description="A file holding the service token, created (random, 0600) if missing. "
        "Default: data_dir/service_token.",
    )

    # Where each service is reached; a service also binds to the host and port of its own URL.
    gateway_url: str = Field(default="http://127.0.0.1:8000", description=_URL_HELP)
    rollout_url: str = Field(default="http://127.0.0.1:8001", description=_URL_HELP)
    reward_url: str = Field(default="http://127.0.0.1:8002", description=_URL_HELP)
    sandbox_url: str = Field(default="http://127.0.0.1:8003", description=_URL_HELP)
    trainer_url: str = Field(default="http://127.0.0.1:8004", description=_URL_HELP)
    modelstate_url: str = Field(default="http://127.0.0.1:8005", description=_URL_HELP)

    def url_of(self, service: str) -> str:
        return str(getattr(self, f"{service}_url")).rstrip("/")

    def bind_of(self, service: str) -> tuple[str, int]:
        """Host and port a service listens on: taken from its own URL setting."""
        parts = urlsplit(self.url_of(service))
        return parts.hostname or "127.0.0.1", parts.port or 80

    @property
    def ready_file(self) -> Path:
        """Written by the worker (a process without a port) once it consumes, with its pid:
        `loom up`'s and the container healthcheck's readiness."""
        return self.data_dir / "run" / "worker.ready"

    def ensure_data_dir(self) -> Path:
        """The data dir, created private (0700) if missing: it holds the service token, the
        databases and the blobs. An existing one keeps the mode its owner gave it."""
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self.data_dir

    def database_url_for(self, service: str) -> str:
        if self.database_url:
            return self.database_url
        path = self.ensure_data_dir() / f"{service}.db"
        # Created 0600 before SQLite opens it: SQLite gives its WAL and shared-memory files
        # the database file's mode, so all three stay private. Only ever created: closing a
        # descriptor of a database file drops every lock this process holds on it, so
        # opening an existing one would leave this process's connections unlocked and let
        # another process delete the WAL under them (a corrupt database).
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return f"sqlite:///{path}"
