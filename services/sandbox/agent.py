"""The sandbox agent: a long-lived process that runs one program at a time, for both backends.

Keeping the set-up in one place means both backends isolate, limit, stop and clean up the same
way. Programs are forked by the agent's launcher (launcher.py, a warm interpreter whose source
is the agent's first argument), which sets each one up. The agent feeds the program, collects
its output, enforces its timeout and cleans up after it. It reads one JSON request per line on
stdin and answers one JSON line on stdout:

    request:  {"language", "code", "stdin", "timeout_s", "max_output_bytes", "overflow_bytes",
               "uid", "python", "limits": {"RLIMIT_X": [soft, hard]}, "files", "collect",
               "max_collect_bytes", "keep_workdir": a session's files stay for its next program}
              or {"op": "close"}: exit (a session's files are in the sandbox's tmpfs)
    response: {"wait_status", "reason", "stdout", "stderr", "stdout_truncated",
               "stderr_truncated", "stderr_tail", "wall_s", "cpu_s", "clean", "files",
               "start_failure": null | {"kind": "input" | "sandbox", "message"},
               "resetting": true when a line {"clean"} follows once /work and /tmp are empty}

- docker backend: the container's command, as root with only CAP_SETUID and CAP_SETGID, so
  programs (started as the unprivileged `uid`, with no capabilities) cannot signal, trace or
  replace it. `/work` and `/tmp` are the container's tmpfs; the agent empties them after each
  program.
- process backend: the same, in a bubblewrap sandbox of the slot's (see confinement.py) with
  the same capabilities, whose /work, /tmp and /dev/shm are tmpfs.

After each program the agent kills every process whose real uid is `uid` (or, without one,
the program's process group) and reaps what it inherited as a subreaper; `clean` is false when
that failed and the service must replace the agent. Standard library only: it runs in any image with
python3, from source passed on the command line, without site-packages.
"""

import base64
import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import stat
import sys
import time

CHUNK = 65536
TAIL_BYTES = 4096
PIPE_GRACE_S = 1.0
# Emptied after each program; the first is the workdir. (/dev/shm: where one is writable.)
CONTAINER_WORKDIRS = ("/work", "/tmp", "/dev/shm")
LAUNCHER_FD = 3  # the launcher's end of its socket to the agent
LAUNCHER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
# What the forked program reads of its request; the agent keeps the rest.
PROGRAM_KEYS = ("language", "code", "files", "limits", "uid")

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36

libc = ctypes.CDLL(None, use_errno=True)


class LauncherFailed(Exception):
    pass


class Launcher:
    """The warm interpreter (launcher.py) that forks programs, started with `python` as root."""

    def __init__(self, python, source):
        self.python = python
        self.socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid = os.fork()
        if self.pid == 0:
            try:
                libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # dies with the agent
                os.dup2(theirs.fileno(), LAUNCHER_FD)
                os.set_inheritable(LAUNCHER_FD, True)
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(null, 0)  # the agent's own protocol stays the agent's
                os.dup2(null, 1)
                os.closerange(LAUNCHER_FD + 1, 65536)
                os.chdir("/")
                os.execve(python, [python, "-E", "-s", "-c", source], LAUNCHER_ENV)
            finally:
                os._exit(127)
        theirs.close()
        try:
            self._receive()  # "ready": the interpreter started
        except (OSError, RuntimeError) as exc:
            self.close()
            raise LauncherFailed(f"cannot start the interpreter {python}") from exc

    def spawn(self, fds):
        """Fork a program that reads its request from fds[0]; its pid."""
        socket.send_fds(self.socket, [b"run"], fds)
        return int(self._receive())

    def report(self):
        """(wait status, CPU seconds) of the program, once it has exited."""
        status, cpu_s = self._receive().split()
        return int(status), float(cpu_s)

    def fileno(self):
        return self.socket.fileno()

    def _receive(self):
        message = self.socket.recv(64)
        if not message:
            raise RuntimeError(f"the launcher ({self.python}) exited")
        return message

    def close(self):
        self.socket.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):  # reaped already, with the orphans
            os.waitpid(self.pid, 0)


def _start(request, launcher):
    """A program forked by the launcher, with fresh pipes; the launcher reports its exit."""
    request_r, request_w = os.pipe()
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    status_r, status_w = os.pipe()
    theirs = (request_r, stdin_r, out_w, err_w, status_w)
    try:
        pid = launcher.spawn(theirs)
    finally:
        for fd in theirs:
            os.close(fd)
    program = {key: request[key] for key in PROGRAM_KEYS}
    with contextlib.suppress(BrokenPipeError), open(request_w, "wb") as fh:
        fh.write(json.dumps(program).encode())  # a program that could not start stops reading
    return pid, stdin_w, out_r, err_r, status_r


def _start_failure_of(status_r):
    """What the child wrote to its status pipe: empty (it started) unless it failed to."""
    written = os.read(status_r, CHUNK)
    os.close(status_r)
    return json.loads(written) if written else None


class _Stream:
    def __init__(self, limit):
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.limit = limit

    def add(self, chunk):
        self.total += len(chunk)
        room = self.limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
        self.tail = (self.tail + chunk)[-TAIL_BYTES:]


def _run(request, launcher):
    started = time.monotonic()
    deadline = started + request["timeout_s"]
    pid, stdin_w, out_r, err_r, status_r = _start(request, launcher)
    out, err = _Stream(request["max_output_bytes"]), _Stream(request["max_output_bytes"])
    open_streams = {out_r: out, err_r: err}
    data = request["stdin"].encode()
    if data:
        os.set_blocking(stdin_w, False)
    else:
        os.close(stdin_w)
        stdin_w = None
    flood_bound = request["max_output_bytes"] + request["overflow_bytes"]
    reason, exited, drain_until = None, None, None
    while True:
        now = time.monotonic()
        if exited is None and now >= deadline:
            reason = "timeout"
            break
        # Once the program is gone, its descendants may still hold its pipes: drain briefly.
        if exited is not None and (not open_streams or now >= drain_until):
            break
        readers = list(open_streams) + ([launcher] if exited is None else [])
        writers = [stdin_w] if stdin_w is not None else []
        until = deadline if exited is None else drain_until
        readable, writable, _ = select.select(readers, writers, [], max(until - now, 0))
        if launcher in readable:
            exited, drain_until = launcher.report(), time.monotonic() + PIPE_GRACE_S
        for fd in readable:
            if fd in open_streams:
                chunk = os.read(fd, CHUNK)
                if chunk:
                    open_streams[fd].add(chunk)
                else:
                    del open_streams[fd]
        if writable:
            try:
                data = data[os.write(stdin_w, data[:CHUNK]) :]
            except BrokenPipeError:
                data = b""
            if not data:
                os.close(stdin_w)
                stdin_w = None
        if exited is None and max(out.total, err.total) > flood_bound:
            reason = "output_limit"
            break
    clean = _stop_everything(request["uid"], pid)
    if exited is None:
        exited = launcher.report()
    wall = time.monotonic() - started
    for fd in (stdin_w, out_r, err_r):
        if fd is not None:
            os.close(fd)
    status, cpu_s = exited
    return {
        "wait_status": status,
        "reason": reason,
        "stdout": out.head.decode("utf-8", "replace"),
        "stderr": err.head.decode("utf-8", "replace"),
        "stdout_truncated": out.total > out.limit,
        "stderr_truncated": err.total > err.limit,
        "stderr_tail": err.tail.decode("utf-8", "replace"),
        "wall_s": wall,
        "cpu_s": cpu_s,
        "clean": clean,
        "start_failure": _start_failure_of(status_r),
    }


def _stop_everything(uid, pid):
    """Kill the program's process group, and with a uid of its own every process of that uid
    (which also catches children that left the group with setsid)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    # True when no process of `uid` is left (always, without a uid of its own).
    return uid is None or _succeeds_as(uid, lambda: _kill_all_of(uid))


@contextlib.contextmanager
def _acting_as(uid):
    """Take the program's uid as the effective ids only, so the agent can signal, read and
    delete what the program owns without forking a helper. The real and saved ids stay root:
    the program's processes can neither signal nor trace the agent meanwhile (both need a
    real or saved uid of theirs), and the agent gets its privileges back afterwards."""
    if uid is None:
        yield
        return
    groups, gid = os.getgroups(), os.getegid()
    os.setgroups([])
    os.setegid(uid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(gid)
        os.setgroups(groups)


def _succeeds_as(uid, work):
    """Run `work` as `uid` (see _acting_as); True if it succeeded."""
    try:
        with _acting_as(uid):
            work()
    except (OSError, RuntimeError):
        return False
    return True


def _kill_all_of(uid):
    # Repeat until none is left: a forking program can add processes during a sweep, and the
    # pids limit bounds how long it can keep that up. (kill(-1) cannot tell: it also
    # "succeeds" when it only reached processes it may not signal.)
    for _ in range(5000):
        alive = _live_processes_of(uid) - {os.getpid()}
        if not alive:
            return
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)
    raise RuntimeError("sandbox processes keep appearing")


def _live_processes_of(uid):
    """By real uid: a program may set its effective uid to root's saved one, never its real."""
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/" + name + "/status") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
        except OSError:
            continue
        if int(fields["Uid"].split()[0]) == uid and fields["State"].split()[0] != "Z":
            found.add(int(name))
    return found


def _empty_container_workdirs(uid):
    def empty():
        for root in CONTAINER_WORKDIRS:
            # As the program's uid: access() would check root's permitted capabilities, which
            # in a container lack CAP_DAC_OVERRIDE, and skip the program's own /work.
            if os.access(root, os.W_OK, effective_ids=True):
                fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    _empty(fd)
                finally:
                    os.close(fd)

    return _succeeds_as(uid, empty)


def _empty(dir_fd):
    """Remove everything in the directory open as `dir_fd`, through directory descriptors and
    names relative to them: a symbolic link is removed, never followed, whatever a program left
    or renamed, so the clean-up cannot be pointed at anything outside."""
    for name in os.listdir(dir_fd):
        if not stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            os.unlink(name, dir_fd=dir_fd)
            continue
        # O_PATH needs no permission on the directory itself, which the program may have
        # taken away; the descriptor's /proc link then names exactly that directory.
        path_fd = os.open(
            name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
        )
        try:
            os.chmod(f"/proc/self/fd/{path_fd}", 0o700)
            fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=path_fd)
        finally:
            os.close(path_fd)
        try:
            _empty(fd)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=dir_fd)


def _reap_orphans():
    """As a subreaper the agent inherits what the program left behind; collect the zombies."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _collect(uid, workdir, paths, budget):
    """Read the requested files as the program's user, following no symbolic link (a link
    could point anywhere the agent can see but the program could not)."""
    if not paths:
        return []
    found = []
    try:
        with _acting_as(uid):
            for path in paths:
                found.append(_read_file(workdir, path, budget))
                budget -= found[-1].get("size") or 0
    except OSError:
        return [{"path": path, "error": "unreadable"} for path in paths]
    return found


def _read_file(workdir, path, budget):
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(workdir, flags | os.O_DIRECTORY)
    try:
        for part in path.split("/")[:-1]:
            parent, fd = fd, os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            os.close(parent)
        parent, fd = fd, os.open(path.split("/")[-1], flags | os.O_NONBLOCK, dir_fd=fd)
        os.close(parent)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return {"path": path, "error": "not a regular file"}
        if info.st_size > budget:
            return {
                "path": path,
                "error": f"too large ({info.st_size} bytes; "
                f"{max(budget, 0)} left of the collect limit)",
            }
        with os.fdopen(fd, "rb") as fh:
            fd = None
            data = fh.read(budget + 1)
        return {"path": path, "content": base64.b64encode(data).decode(), "size": len(data)}
    except OSError as exc:
        if exc.errno in (2, 20):  # ENOENT, ENOTDIR
            return {"path": path, "error": "missing"}
        if exc.errno == 40:  # ELOOP: O_NOFOLLOW met a link
            return {"path": path, "error": "a symbolic link (not followed)"}
        return {"path": path, "error": f"unreadable ({exc.strerror})"}
    finally:
        if fd is not None:
            os.close(fd)


def main():
    launcher_source = sys.argv[1]
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a program that stops reading stdin: EPIPE
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # dies with the service
    launcher = None
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("op") == "close":
            break
        python = request["python"] or sys.executable
        if launcher is None or launcher.python != python:
            if launcher is not None:
                launcher.close()
                launcher = None
            try:
                launcher = Launcher(python, launcher_source)
            except LauncherFailed as exc:
                _answer(_start_failure(str(exc)))
                continue
        keep = request["keep_workdir"]
        response = _run(request, launcher)
        response["files"] = _collect(
            request["uid"], CONTAINER_WORKDIRS[0], request["collect"], request["max_collect_bytes"]
        )
        _reap_orphans()
        # A container's workdirs are emptied after the answer, so a program that left very
        # many files still gets its answer (say `timeout`) in time.
        response["resetting"] = response["clean"] and not keep
        _answer(response)
        if response["resetting"]:
            _answer({"clean": _empty_container_workdirs(request["uid"])})


def _answer(response):
    sys.stdout.write(json.dumps(response) + "\n")
    sys.stdout.flush()


def _start_failure(message):
    """The answer for a program that could not start because its interpreter did not."""
    return {
        "wait_status": 0,
        "reason": None,
        "stdout": "",
        "stderr": "",
        "stdout_truncated": False,
        "stderr_truncated": False,
        "stderr_tail": "",
        "wall_s": 0.0,
        "cpu_s": 0.0,
        "clean": True,
        "files": [],
        "start_failure": {"kind": "sandbox", "message": message},
    }


if __name__ == "__main__":
    main()
