"""SQLite's locks are POSIX locks, held per process: closing any descriptor of a database file
drops all of them, and a connection left open across a fork is shared in a way SQLite cannot
lock. Either let another process take the database for its own (it then deletes the WAL under
the open connection): `loom demo`'s gateway.db was found corrupt after 3 of 9 runs. These
tests hold the code to never do either."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from services.common.db import make_engine, migrate
from services.common.settings import LoomSettings
from services.worker.models import ALEMBIC_DIR, VERSION_TABLE, GatewayNotMigrated

PROBE = """
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR)
probe = struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0)
print(struct.unpack("hhqqi", fcntl.fcntl(fd, fcntl.F_GETLK, probe))[0])
"""


def locked_by_another_process(path: Path) -> bool:
    """Whether some process (this one, seen from a child) holds a lock on `path`."""
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, check=True
    )
    return int(probe.stdout) != fcntl.F_UNLCK


def open_descriptors_of(path: Path) -> list[str]:
    fds = Path("/proc/self/fd")
    found = []
    for fd in fds.iterdir():
        try:
            if Path(os.readlink(fd)) == path:
                found.append(fd.name)
        except OSError:
            continue
    return found


def test_asking_for_the_database_url_keeps_open_connections_locked(tmp_path: Path) -> None:
    settings = LoomSettings(data_dir=tmp_path)
    engine = make_engine(settings.database_url_for("gateway"))
    try:
        with engine.connect() as connection:
            connection.execute(text("CREATE TABLE t (x INTEGER)"))
            connection.commit()
            # An open connection to a WAL database holds a shared lock on the file.
            assert locked_by_another_process(tmp_path / "gateway.db")
            settings.database_url_for("gateway")  # as a service does for another engine
            assert locked_by_another_process(tmp_path / "gateway.db")
    finally:
        engine.dispose()


def test_a_failed_migration_leaves_no_connection_open(tmp_path: Path) -> None:
    database = tmp_path / "gateway.db"
    # The worker's tables before the gateway made `jobs`: the worker waits and tries again.
    with pytest.raises(GatewayNotMigrated):
        migrate(f"sqlite:///{database}", ALEMBIC_DIR, VERSION_TABLE)
    assert open_descriptors_of(database) == []
