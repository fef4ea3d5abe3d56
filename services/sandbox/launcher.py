"""First code to run inside every process-backend sandbox, before the user's program.

Started as `python -I -S launcher.py WORKDIR UID|- PYTHON [RLIMIT_X=SOFT,HARD ...]` with a
scrubbed environment and a new session (plain arguments, not JSON: importing `json` would double
the launcher's start-up time). It confines itself (rlimits, a private network namespace, an
unprivileged uid, no new privileges) and then execs a fresh interpreter on `main.py`, so the
user's program starts from a clean interpreter and its tracebacks show no sandbox frames.
Standard library only: this file runs as a script, outside the `services` package, without
site-packages. Doing this in a child script instead of a `preexec_fn` keeps Python code out of
the window between fork and exec, which is unsafe in a threaded server.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38

ISOLATION_FAILED_EXIT = 125
MESSAGE_PREFIX = "loom-sandbox:"


def _fail(message: str) -> None:
    sys.stderr.write(f"{MESSAGE_PREFIX} {message}\n")
    sys.stderr.flush()
    os._exit(ISOLATION_FAILED_EXIT)


def _isolate_network(libc: ctypes.CDLL) -> None:
    """A new network namespace holds only a loopback device that is down: nothing is reachable.
    Root can create one directly; other users need a user namespace around it."""
    if libc.unshare(CLONE_NEWNET) == 0:
        return
    first = ctypes.get_errno()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        return
    _fail(f"cannot isolate the network (unshare: {os.strerror(first)}, "
          f"with a user namespace: {os.strerror(ctypes.get_errno())})")


def main() -> None:
    workdir, uid_arg, python, *limits = sys.argv[1:]
    os.closerange(3, 65536)  # fds a C library leaked into the service must not reach the sandbox
    os.chdir(workdir)
    for limit in limits:
        name, values = limit.split("=")
        soft, hard = values.split(",")
        resource.setrlimit(getattr(resource, name), (int(soft), int(hard)))
    libc = ctypes.CDLL(None, use_errno=True)
    _isolate_network(libc)
    if uid_arg != "-":
        uid = int(uid_arg)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _fail(f"prctl(NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
    # Set after setuid, which clears it: the sandbox dies with the service.
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:
        os.execv(python, [python, "-I", "main.py"])
    except OSError as exc:
        _fail(f"cannot run the sandbox interpreter {python}: {exc}")


if __name__ == "__main__":
    main()
