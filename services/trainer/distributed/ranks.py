"""The coordinator's side of a sharded trainer: `RankGroup` starts the ranks (one process each,
`services.trainer.distributed.rank`), hands every command to all of them in the order it is
called, and returns rank 0's answer.

Each rank talks to the coordinator over a socket pair it inherits (no address, nothing another
process can connect to). A rank that dies (its connection closes), or fails where the others
did not, fails the command in flight with `RankFailed` naming it; the group is then formed
again from fresh processes, and the models it had are created again from their specs (at their
base weights: `load_state` brings a job back to its last checkpoint), so the trainer keeps
serving. The ranks' collectives time out (`RankConfig.timeout_s`), so a rank waiting on a dead
one does not wait for ever.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from typing import Any

from services.common.errors import Unavailable
from services.trainer.distributed.commands import CHANNEL_ENV, RANK_ENV, RankConfig

# How long the ranks may take to start and join, and to stop when told.
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 10.0


class RankFailed(Unavailable):
    """A rank died or broke mid-command; the group was formed again."""

    code = "trainer_rank_failed"


class RankGroup:
    def __init__(self, config: RankConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._replay: list[tuple[Any, ...]] = []  # commands a new group runs again (creates)
        self._procs: list[subprocess.Popen[bytes]] = []
        self._conns: list[Connection] = []
        self.restarts = 0

    @property
    def world_size(self) -> int:
        return self.config.world_size

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    def start(self) -> None:
        with self._lock:
            self._start()

    def call(self, *command: Any, replay: bool = False) -> Any:
        """Runs `command` on every rank; rank 0's result (or the error it raised). `replay`:
        run it again on a group formed after a failure (for commands that make models)."""
        with self._lock:
            if not self._procs:
                self._start()
            result = self._call(command)
            if replay:
                self._replay.append(command)
            return result

    def stop(self) -> None:
        with self._lock:
            self._stop()

    # --- internals ------------------------------------------------------------------------

    def _call(self, command: tuple[Any, ...]) -> Any:
        try:
            replies = self._exchange(command)
        except RankFailed:
            self._stop(kill=True)
            self._start()
            for earlier in self._replay:
                self._exchange(earlier)
            raise
        status, value = replies[0]
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
            "The trainer restarted its ranks; its models are back at their base weights: "
            "load_state resumes a job from its last checkpoint.",
            {"rank": rank, "operation": operation})

    def _start(self) -> None:
        config = replace(self.config, master_port=_free_port())
        for rank in range(config.world_size):
            mine, theirs = socket.socketpair()
            self._procs.append(subprocess.Popen(
                [sys.executable, "-m", "services.trainer.distributed.rank"],
                env={**os.environ, RANK_ENV: str(rank), CHANNEL_ENV: str(theirs.fileno())},
                pass_fds=(theirs.fileno(),)))
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
        if self._replay:
            self.restarts += 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])

