"""Command channels of ranks on other hosts: a rank there cannot inherit a socket pair from
the coordinator, so it connects to the address the coordinator listens on
(`LOOM_TRAINER_COORDINATOR`) and both prove they hold the service token before anything else
is read: multiprocessing's HMAC challenge, both ways, with a key derived from the token. The
commands that follow are pickles, which run code when read: nothing is unpickled from a peer
that has not answered the challenge.

The handshake only authenticates; the bytes after it travel unencrypted and unsigned, so the
channel belongs on a network no one else can inject packets into (the cluster's private
network, or a tunnel), as torch's own rendezvous and collectives do (those are not
authenticated at all).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import queue
import socket
import struct
import threading
import time
from multiprocessing.connection import (
    Client,
    Connection,
    answer_challenge,
    deliver_challenge,
)

log = logging.getLogger(__name__)

# How long a connecting peer may take to answer the challenge and say which rank it is, and
# how many may be answering at once (more are dropped unread): a peer that stalls, or a flood
# of them, must not hold up the ranks behind them or pile up threads.
HANDSHAKE_TIMEOUT_S = 10.0
MAX_HANDSHAKES = 64


def authkey(token: str) -> bytes:
    """The channel's key: the token is not used as is, so the channel's key, if it ever leaked,
    would not open the services' HTTP routes."""
    return hmac.new(token.encode(), b"loom trainer rank channel", hashlib.sha256).digest()


def parse_address(address: str) -> tuple[str, int]:
    """'host:port' (IPv6: '[::1]:port')."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not host:port (e.g. 10.0.0.1:29400)")
    return host.strip("[]"), int(port)


class RankListener:
    """Where ranks of other hosts join: bound to `address` from construction to `close`. Each
    connection is authenticated in a thread of its own (bounded by HANDSHAKE_TIMEOUT_S), then
    says its rank; those of `ranks` wait in `joined` for the group that forms next."""

    def __init__(self, address: tuple[str, int], key: bytes, ranks: range) -> None:
        self.address = address
        self.ranks = ranks
        self._key = key
        self.joined: queue.Queue[tuple[int, Connection]] = queue.Queue()
        self._handshakes = threading.BoundedSemaphore(MAX_HANDSHAKES)
        self._server = socket.create_server(address)
        self._thread = threading.Thread(target=self._accept, daemon=True, name="rank-listener")
        self._thread.start()

    def take(self, deadline: float) -> tuple[int, Connection]:
        """The next rank that joined; TimeoutError after `deadline` (time.monotonic())."""
        try:
            return self.joined.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError("no rank joined in time") from None

    def close(self) -> None:
        self._server.close()
        while not self.joined.empty():
            self.joined.get_nowait()[1].close()

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self._server.accept()
            except OSError:  # closed
                return
            if not self._handshakes.acquire(blocking=False):
                sock.close()
                continue
            threading.Thread(target=self._greet, args=(sock, peer), daemon=True).start()

    def _greet(self, sock: socket.socket, peer: object) -> None:
        try:
            self._handshake(sock, peer)
        finally:
            self._handshakes.release()

    def _handshake(self, sock: socket.socket, peer: object) -> None:
        sock.setblocking(True)
        conn = Connection(sock.detach())
        _receive_timeout(conn.fileno(), HANDSHAKE_TIMEOUT_S)
        try:
            deliver_challenge(conn, self._key)
            answer_challenge(conn, self._key)
            rank = conn.recv()
        except Exception as exc:  # noqa: BLE001 - whatever a peer makes fail refuses it
            log.warning("Refused a trainer rank channel from %s: %s", peer, exc)
            conn.close()
            return
        if not isinstance(rank, int) or rank not in self.ranks:
            log.warning("Refused rank %r from %s: expected one of %s", rank, peer, self.ranks)
            conn.close()
            return
        _receive_timeout(conn.fileno(), 0.0)
        self.joined.put((rank, conn))


def connect(address: tuple[str, int], key: bytes, rank: int, deadline: float) -> Connection:
    """A rank's channel to the coordinator, retried until `deadline` (time.monotonic()) while
    nothing listens there (the trainer starting, or forming its group again);
    AuthenticationError at once when the coordinator refuses the key or fails to prove its
    own."""
    while True:
        try:
            conn = Client(address, authkey=key)
        except (ConnectionRefusedError, ConnectionResetError, EOFError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
            continue
        conn.send(rank)
        return conn


def _receive_timeout(fd: int, seconds: float) -> None:
    """SO_RCVTIMEO (0: none) keeps the descriptor blocking, as `Connection` needs, while a read
    that waits longer fails."""
    sock = socket.socket(fileno=fd)
    try:
        whole = int(seconds)
        timeval = struct.pack("ll", whole, int((seconds - whole) * 1e6))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    finally:
        sock.detach()  # the descriptor stays the connection's
