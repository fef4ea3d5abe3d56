"""The node agent: runs one host's ranks of a trainer whose ranks span several hosts.

    python -m services.trainer.distributed.node

Environment: the trainer's own LOOM_TRAINER_WORLD_SIZE, LOOM_TRAINER_NNODES and
LOOM_TRAINER_COORDINATOR (host:port the trainer listens on for its ranks), this host's
LOOM_TRAINER_NODE_RANK (1 .. NNODES-1), and the trainer's service token (LOOM_SERVICE_TOKEN, or
LOOM_SERVICE_TOKEN_FILE, or LOOM_DATA_DIR/service_token). The trainer's data, work and checkpoint
directories must be at the same paths here (a shared filesystem): each rank writes its shards.

The agent starts the host's ranks (WORLD_SIZE / NNODES of them: ranks NODE_RANK x that ..);
each connects to the trainer, proves it holds the token, takes its configuration (device,
precision, rendezvous) from the trainer and joins the group through torch's rendezvous. When
any of them exits (a rank died, or the trainer formed its group again, or restarted) the agent
stops the others and starts them all again, so the group forms again with no one to call. It
runs until SIGTERM or SIGINT; it exits with code 2 when the trainer refuses its ranks' token
(starting it again would not help).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

from services.common.service_token import service_token
from services.trainer.distributed.commands import RANK_ENV, REFUSED
from services.trainer.settings import TrainerSettings

log = logging.getLogger(__name__)

# Between one generation of ranks and the next (a trainer that is restarting gets time to).
RESTART_DELAY_S = 1.0
STOP_TIMEOUT_S = 10.0


def start(rank: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "services.trainer.distributed.rank"],
        env={**os.environ, RANK_ENV: str(rank)},
    )


def wait_any(procs: list[subprocess.Popen[bytes]]) -> int:
    """The exit code of the first of `procs` to exit."""
    while True:
        for proc in procs:
            code = proc.poll()
            if code is not None:
                return code
        time.sleep(0.2)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(settings: TrainerSettings) -> int:
    """Generations of this host's ranks until a signal (0) or a refusal (2)."""
    ranks = settings.ranks_of_node(settings.trainer_node_rank)
    while True:
        procs: list[subprocess.Popen[bytes]] = []
        try:  # a signal between two starts still stops the ranks started
            for rank in ranks:
                procs.append(start(rank))
            code = wait_any(procs)
        finally:
            stop(procs)
        if code == REFUSED:
            return code
        log.warning("A trainer rank of %s exited (code %d): starting them again", ranks, code)
        time.sleep(RESTART_DELAY_S)


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    settings = TrainerSettings()
    if settings.trainer_nnodes == 1 or settings.trainer_node_rank == 0:
        sys.exit(
            "The node agent runs the ranks of another host of a trainer on several hosts: "
            "set LOOM_TRAINER_NNODES > 1 and LOOM_TRAINER_NODE_RANK (1 .. NNODES-1)."
        )
    service_token(settings)  # no token, no point in starting ranks: say so now

    def leave(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGINT, leave)
    sys.exit(run(settings))


if __name__ == "__main__":
    main()
