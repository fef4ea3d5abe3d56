"""`python -m cli.cluster.keeper <module>`: runs `python -m <module>` and takes its whole
process group down with it. A Ray actor starts each service through a keeper: the keeper gets
SIGTERM when the actor's process dies (a parent-death signal), as when the actor stops it, and
then stops the service (SIGTERM, a grace period) and SIGKILLs what is left of the group, so no
engine or pool process of the service outlives its actor, however the actor ended."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from types import FrameType

PR_SET_PDEATHSIG = 1
GRACE_S = 60


def main(module: str) -> int:
    if os.getpgrp() != os.getpid():  # the group killed at the end must be ours alone
        os.setsid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    service = subprocess.Popen([sys.executable, "-m", module])

    def stop(_signum: int, _frame: FrameType | None) -> None:
        """Pass the stop on; the service gets GRACE_S to finish before the group is killed
        (nothing waits here: the main thread's wait reaps the service)."""
        service.terminate()
        signal.alarm(GRACE_S)

    def kill(_signum: int, _frame: FrameType | None) -> None:
        os.killpg(0, signal.SIGKILL)

    signal.signal(signal.SIGALRM, kill)
    signal.signal(signal.SIGTERM, stop)
    code = service.wait()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(0, signal.SIGKILL)  # what the service left behind, and this keeper
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
