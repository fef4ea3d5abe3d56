"""The coordinator's side of a sharded trainer: `RankGroup` starts the ranks (one process each,
`services.trainer.distributed.rank`), hands every command to all of them in the order it is
called, and returns rank 0's answer.

Each rank talks to the coordinator over a socket pair it inherits (no address, nothing another
process can connect to). A rank that dies (its connection closes), or fails where the others
did not, fails the command in flight with `RankFailed` naming it; the group is then formed
again from fresh processes and handed to the `on_reform` hook (the registry's, which makes its
models again and reloads their checkpoints) before any other command runs, so the trainer
keeps serving. The ranks' collectives time out (`RankConfig.timeout_s`), so a rank waiting on
a dead one does not wait for ever.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from typing import Any

from services.common.errors import Unavailable
from services.trainer.distributed.commands import CHANNEL_ENV, RANK_ENV, RankConfig

log = logging.getLogger(__name__)

# How long the ranks may take to start and join, and to stop when told.
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 10.0


class RankFailed(Unavailable):
    """A rank died or broke mid-command; the group was formed again."""

    code = "trainer_rank_failed"


# Runs a command on every rank of a new group: rank 0's result, or the error it raised.
Run = Callable[[tuple[Any, ...]], Any]
# What a group formed again after `RankFailed` does before it takes any other command.
Reform = Callable[[Run, RankFailed], None]


class RankGroup:
    def __init__(self, config: RankConfig) -> None:
        self.config = config
        self._lock = threading.RLock()
        self._procs: list[subprocess.Popen[bytes]] = []
        self._conns: list[Connection] = []
        self.on_reform: Reform | None = None
        # The failure whose group has not been given to `on_reform` yet (that failed, or the
        # new group did not start): the next command forms it again first.
        self._unrecovered: RankFailed | None = None

    @property
    def world_size(self) -> int:
        return self.config.world_size

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    def start(self) -> None:
        with self._lock:
            self._form()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Nothing else runs on the group meanwhile (a re-forming included), but `call`s here."""
        with self._lock:
            yield

    def call(self, *command: Any, check: Callable[[], None] | None = None) -> Any:
        """Runs `command` on every rank; rank 0's result (or the error it raised). `check`
        runs first, in turn with every other command (after any re-forming), and may refuse."""
        with self._lock:
            if not self._procs or self._unrecovered is not None:
                self._form()
            if check is not None:
                check()
            try:
                return self._run(command)
            except RankFailed as failure:
                self._stop(kill=True)
                self._unrecovered = failure
                try:
                    self._form()
                except Exception:  # noqa: BLE001 - the next command tries again, and says why
                    log.exception(
                        "The trainer's ranks were not formed again after: %s", failure.message
                    )
                raise

    def stop(self) -> None:
        with self._lock:
            self._stop()

    # --- internals ------------------------------------------------------------------------

    def _form(self) -> None:
        """Starts the ranks; after a failure, hands them to `on_reform` (a group that fails
        there is stopped, to be formed again by the next command)."""
        if not self._procs:
            self._start()
        failure = self._unrecovered
        if failure is None or self.on_reform is None:
            self._unrecovered = None
            return
        try:
            self.on_reform(self._run, failure)
        except BaseException:
            self._stop(kill=True)
            raise
        self._unrecovered = None

    def _run(self, command: tuple[Any, ...]) -> Any:
        status, value = self._exchange(command)[0]
        if status == "error":
            cls, message, detail = value
            raise cls(message, detail)
        return value

    def _exchange(self, command: tuple[Any, ...]) -> list[tuple[str, Any]]:
        """Every rank's reply; RankFailed when a rank dies or fails where others did not."""
        name = command[2] if command[0] in ("call", "run") else command[0]
        for rank, conn in enumerate(self._conns):
            try:
                conn.send(command)
            except OSError:
                raise self._failure(rank, name) from None
        replies: dict[int, tuple[str, Any]] = {}
        waiting = dict(enumerate(self._conns))
        while waiting:
            for conn in wait(list(waiting.values())):
                rank = self._conns.index(conn)  # type: ignore[arg-type]
                try:
                    replies[rank] = conn.recv()  # type: ignore[union-attr]
                except (EOFError, OSError):
                    raise self._failure(rank, name) from None
                del waiting[rank]
        # An unexpected exception, or ranks that disagree, may leave their collectives out of
        # step: the group is formed again.
        for rank in sorted(replies):
            status, value = replies[rank]
            if status == "crash":
                raise self._failure(rank, name, value.splitlines()[0])
            if status != replies[0][0]:
                raise self._failure(rank, name, f"it answered {status}, rank 0 {replies[0][0]}")
        return [replies[rank] for rank in range(len(self._conns))]

    def _failure(self, rank: int, operation: str, reason: str | None = None) -> RankFailed:
        proc = self._procs[rank]
        try:
            code = proc.wait(timeout=2.0)
            reason = reason or f"it exited with code {code}"
        except subprocess.TimeoutExpired:
            reason = reason or "its connection closed"
        return RankFailed(
            f"Trainer rank {rank} of {self.world_size} failed during {operation} ({reason}). "
            "The trainer starts its ranks again and reloads each model's last checkpoint "
            "(save_state or load_state), or its base weights where it had none; training since "
            "is lost (the model's info says where it is: `restored`).",
            {"rank": rank, "operation": operation},
        )

    def _start(self) -> None:
        config = replace(self.config, master_port=_free_port())
        for rank in range(config.world_size):
            mine, theirs = socket.socketpair()
            self._procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "services.trainer.distributed.rank"],
                    env={**os.environ, RANK_ENV: str(rank), CHANNEL_ENV: str(theirs.fileno())},
                    pass_fds=(theirs.fileno(),),
                )
            )
            theirs.close()
            self._conns.append(Connection(mine.detach()))
        for conn in self._conns:
            conn.send(config)
        for rank, conn in enumerate(self._conns):
            try:
                if not conn.poll(START_TIMEOUT_S):
                    raise TimeoutError(f"no answer in {START_TIMEOUT_S:.0f} s")
                conn.recv()
            except (EOFError, OSError) as exc:
                self._stop(kill=True)
                raise Unavailable(f"Trainer rank {rank} did not join its group: {exc}") from exc

    def _stop(self, kill: bool = False) -> None:
        """Tells the ranks to leave and waits for them; `kill`: at once (a broken group)."""
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in self._procs:
            if kill:
                proc.kill()
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
