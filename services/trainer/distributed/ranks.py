"""The coordinator's side of a sharded trainer: `RankGroup` starts the ranks (one process each,
`services.trainer.distributed.rank`), hands every command to all of them in the order it is
called, and returns rank 0's answer.

Each rank of this host talks to the coordinator over a socket pair it inherits (no address,
nothing another process can connect to); ranks of other hosts (`LOOM_TRAINER_NNODES` > 1,
started by `services.trainer.distributed.node`) join through a `RankListener`, which lets in
only holders of the service token.

A rank that dies (its connection closes), or fails where the others did not, fails the command
in flight with `RankFailed` naming it; the group is then formed again from fresh processes
(other hosts' node agents start theirs again when their channels close) and handed to the
`on_reform` hook (the registry's, which makes its models again and reloads their checkpoints)
before any other command runs, so the trainer keeps serving. The ranks' collectives time out
(`RankConfig.timeout_s`), so a rank waiting on a dead one does not wait for ever.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from typing import Any

from services.common.errors import Unavailable
from services.trainer.distributed.channel import RankListener
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
    """`listener`: where the ranks of other hosts join (its `ranks`); the others are this
    host's."""

    def __init__(self, config: RankConfig, listener: RankListener | None = None) -> None:
        self.config = config
        self.listener = listener
        self.local_ranks = config.world_size - (0 if listener is None else len(listener.ranks))
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
        """This host's ranks' processes."""
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
            if self.listener is not None:
                self.listener.close()

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
        if reason is None and rank < len(self._procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                reason = f"it exited with code {self._procs[rank].wait(timeout=2.0)}"
        if reason is None:
            where = "" if rank < len(self._procs) else " (it runs on another host)"
            reason = f"its connection closed{where}"
        return RankFailed(
            f"Trainer rank {rank} of {self.world_size} failed during {operation} ({reason}). "
            "The trainer starts its ranks again and reloads each model's last checkpoint "
            "(save_state or load_state), or its base weights where it had none; training since "
            "is lost (the model's info says where it is: `restored`).",
            {"rank": rank, "operation": operation},
        )

    def _start(self) -> None:
        """This host's ranks started, the others' joined (through the listener), all told the
        configuration and answered. A master port of 0 picks a free one on 127.0.0.1 (one
        host); ranks across hosts meet at the configured rendezvous."""
        config = self.config
        if not config.master_port:
            config = replace(config, master_port=_free_port())
        for rank in range(self.local_ranks):
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
        self._conns.extend(self._join_remote())
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

    def _join_remote(self) -> list[Connection]:
        """The other hosts' ranks' channels, in rank order, as they join (a rank that joins
        twice, its node agent having restarted it, replaces its older channel)."""
        if self.listener is None:
            return []
        joined: dict[int, Connection] = {}
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(joined) < len(self.listener.ranks):
            try:
                rank, conn = self.listener.take(deadline)
            except TimeoutError:
                missing = sorted(set(self.listener.ranks) - set(joined))
                for conn in joined.values():
                    conn.close()
                self._stop(kill=True)
                host, port = self.listener.address
                raise Unavailable(
                    f"Trainer ranks {missing} did not join in {START_TIMEOUT_S:.0f} s: start "
                    "`python -m services.trainer.distributed.node` on their hosts, with "
                    f"LOOM_TRAINER_COORDINATOR={host}:{port} and this trainer's service token."
                ) from None
            if rank in joined:
                joined[rank].close()
            joined[rank] = conn
        return [joined[rank] for rank in self.listener.ranks]

    def _stop(self, kill: bool = False) -> None:
        """Tells the ranks to leave and waits for them; `kill`: at once (a broken group). Ranks
        of other hosts leave when their channel closes (their node agent starts them again)."""
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
