"""The process backend's sandbox: the bubblewrap command line around one slot's agent.

Why bubblewrap: it is the small, audited, setuid-free tool that Flatpak and others use to do
exactly this (namespaces, a root built from read-only bind mounts and tmpfs, a seccomp filter
installed last, dropped capabilities, death with its parent), packaged by every distribution.
Hand-written namespace code in the launcher did less of it (no PID namespace, the host's root
file system) and would have to grow into a worse copy.

Each slot's agent runs in new PID, mount, network (loopback only, down), IPC, UTS and cgroup
namespaces, with its own /proc and a minimal /dev. Its root is an empty tmpfs with, read-only,
/usr (the interpreter, its libraries, bash and coreutils; with the merged-/usr links /bin,
/lib...), the loader's cache, and the prefix of an interpreter that lives elsewhere; /work,
/tmp and /dev/shm are tmpfs of `sandbox_tmp_mb` each, emptied by the agent after each program
(the tmpfs pages count against the slot's memory limit too). Nothing else of the host is there:
no /run (daemons' sockets), /var, /home, /etc, the project or the data directory.

As root, the agent keeps only CAP_SETUID and CAP_SETGID to run programs as the slot's uid (as in
the docker backend); as another user bubblewrap adds a user namespace and programs run as that
user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`, or run "
    "services/sandbox/ensure-bwrap.sh), or use the docker backend"
)
READ_ONLY = ("/usr",)
# On merged-/usr systems these are links into /usr; elsewhere directories of their own.
TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# The dynamic loader's cache and the alternatives system's links (e.g. awk): no secrets.
ETC_READ_ONLY = ("/etc/ld.so.cache", "/etc/alternatives")
SCRATCH_DIRS = ("/work", "/tmp", "/dev/shm")
AGENT_CAPABILITIES = ("CAP_SETUID", "CAP_SETGID")


def find_bwrap(setting: str) -> str:
    """The bubblewrap executable, or a RuntimeError saying how to get it."""
    path = shutil.which(setting)
    if path is None:
        raise RuntimeError(
            f"the process sandbox needs bubblewrap ({setting!r} is not on the PATH): {INSTALL_HINT}"
        )
    return path


def bwrap_version(bwrap: str) -> str:
    completed = subprocess.run(
        [bwrap, "--version"], capture_output=True, text=True, timeout=10, check=False
    )
    return completed.stdout.strip() or completed.stderr.strip()


def interpreter_prefix(python: str) -> Path | None:
    """The installation an interpreter outside /usr belongs to (`<prefix>/bin/python3`), which
    must be visible in the sandbox; None for one under /usr."""
    real = Path(os.path.realpath(python))
    if any(real.is_relative_to(directory) for directory in READ_ONLY):
        return None
    return real.parents[1]


def bwrap_command(
    bwrap: str, *, prefixes: list[Path], tmp_mb: int, seccomp_fd: int, as_root: bool
) -> list[str]:
    """bubblewrap's arguments up to (not including) the command it runs."""
    args = [
        bwrap,
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
        "--die-with-parent",
        "--new-session",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
    ]
    if as_root:
        args += ["--cap-drop", "ALL"]
        for capability in AGENT_CAPABILITIES:
            args += ["--cap-add", capability]
    else:
        args += ["--unshare-user", "--disable-userns"]
    for directory in READ_ONLY:
        args += ["--ro-bind", directory, directory]
    for name in TOP_LEVEL:
        path = Path("/", name)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    for path in ETC_READ_ONLY:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    for prefix in dict.fromkeys(prefixes):
        # bubblewrap would create the parents 0700: the slot's uid must be able to pass.
        for parent in reversed(prefix.parents[:-1]):
            args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", str(prefix), str(prefix)]
    for directory in SCRATCH_DIRS:
        # Root-owned and sticky: a program cannot take the directory itself away from the
        # agent that empties it.
        args += ["--perms", "1777", "--size", str(tmp_mb * 1024 * 1024), "--tmpfs", directory]
    return [*args, "--chdir", "/", "--seccomp", str(seccomp_fd), "--"]
