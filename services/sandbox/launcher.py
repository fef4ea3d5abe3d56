"""First code to run inside every process-backend sandbox, before the user's program.

Started as `python -I -S launcher.py WORKDIR UID|- TMP_MB PYTHON [RLIMIT_X=SOFT,HARD ...]` with
a scrubbed environment and a new session (plain arguments, not JSON: importing `json` would
double the launcher's start-up time). It confines itself (rlimits, private network and mount
namespaces with a fresh /tmp, an unprivileged uid, no new privileges) and then execs a fresh
interpreter on `main.py`, so the user's program starts from a clean interpreter and its
tracebacks show no sandbox frames.
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

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38

SHARED_WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
ISOLATION_FAILED_EXIT = 125
MESSAGE_PREFIX = "loom-sandbox:"


def _fail(message: str) -> None:
    sys.stderr.write(f"{MESSAGE_PREFIX} {message}\n")
    sys.stderr.flush()
    os._exit(ISOLATION_FAILED_EXIT)


def _unshare(libc: ctypes.CDLL) -> None:
    """A new network namespace holds only a loopback device that is down: nothing is reachable.
    A new mount namespace lets the sandbox have its own /tmp. Root can create both directly;
    other users need a user namespace around them."""
    if libc.unshare(CLONE_NEWNET | CLONE_NEWNS) == 0:
        return
    first = ctypes.get_errno()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS) == 0:
        return
    _fail(f"cannot isolate network and mounts (unshare: {os.strerror(first)}, "
          f"with a user namespace: {os.strerror(ctypes.get_errno())})")


def _mount(libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    def c_string(value: str | None) -> bytes | None:
        return None if value is None else value.encode()

    if libc.mount(c_string(source), target.encode(), c_string(fstype), flags,
                  c_string(data)) != 0:
        _fail(f"mount {target}: {os.strerror(ctypes.get_errno())}")


def _private_tmp(libc: ctypes.CDLL, workdir: str, size_mb: str) -> None:
    """A fresh tmpfs on every world-writable directory of a usual host, dying with the sandbox,
    so nothing is left in (or read from) the host's. The workdir, which may live under one of
    them, is bound back into place."""
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)  # our mounts stay ours
    workdir_fd = os.open(workdir, os.O_PATH | os.O_DIRECTORY)
    for directory in SHARED_WRITABLE_DIRS:
        if os.path.isdir(directory):
            _mount(libc, "tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV,
                   f"size={size_mb}m,mode=1777")
    if workdir.startswith(tuple(d + "/" for d in SHARED_WRITABLE_DIRS)):
        os.makedirs(workdir, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{workdir_fd}", workdir, None, MS_BIND)
    os.close(workdir_fd)


def main() -> None:
    workdir, uid_arg, tmp_mb, python, *limits = sys.argv[1:]
    os.closerange(3, 65536)  # fds a C library leaked into the service must not reach the sandbox
    for limit in limits:
        name, values = limit.split("=")
        soft, hard = values.split(",")
        resource.setrlimit(getattr(resource, name), (int(soft), int(hard)))
    libc = ctypes.CDLL(None, use_errno=True)
    _unshare(libc)
    _private_tmp(libc, workdir, tmp_mb)
    os.chdir(workdir)
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
