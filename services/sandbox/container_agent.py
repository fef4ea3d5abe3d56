"""The agent inside every docker-backend sandbox container: it runs one program at a time.

Started as the container's command (`python3 -I -S -c <this file>`), as root with only
CAP_SETUID and CAP_SETGID, so it can start programs as the unprivileged sandbox user and the
programs cannot signal, trace or replace it. It reads one JSON request per line on stdin and
answers one JSON line on stdout:

    request:  {"code", "stdin", "timeout_s", "memory_mb", "max_output_bytes", "overflow_bytes",
               "uid", "limits": {"RLIMIT_X": [soft, hard]}}
    response: {"wait_status", "reason", "stdout", "stderr", "stdout_truncated",
               "stderr_truncated", "stderr_tail", "wall_s", "cpu_s", "clean"}

After each program it kills every process of the sandbox uid and empties /work and /tmp, so
the container is as fresh for the next program; `clean` is false when that failed and the
service must replace the container. Standard library only (it runs in any image with python3),
and the service passes its source on the command line, so images need not be rebuilt when it
changes.
"""

import contextlib
import json
import os
import resource
import select
import signal
import stat
import sys
import time

WORKDIRS = ("/work", "/tmp")
CHUNK = 65536
TAIL_BYTES = 4096
PIPE_GRACE_S = 1.0
POLL_S = 0.05


def _as_sandbox_user(uid):
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _start(request):
    """Fork the program: its own session, the sandbox uid, rlimits, fresh pipes."""
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            # If the container runs out of memory, the kernel kills the program, not the agent.
            with open("/proc/self/oom_score_adj", "w") as fh:
                fh.write("1000")
            _as_sandbox_user(request["uid"])
            os.chdir("/work")
            with open("main.py", "w", encoding="utf-8") as fh:
                fh.write(request["code"])
            for name, (soft, hard) in request["limits"].items():
                resource.setrlimit(getattr(resource, name), (soft, hard))
            os.dup2(stdin_r, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.closerange(3, 65536)
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/work", "TMPDIR": "/tmp",
                   "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                   "MKL_NUM_THREADS": "1"}
            os.execve(sys.executable, [sys.executable, "-I", "main.py"], env)
        except BaseException as exc:  # noqa: BLE001 - the child must never return
            os.write(err_w, f"loom-sandbox: cannot start the program: {exc}\n".encode())
        os._exit(125)
    for fd in (stdin_r, out_w, err_w):
        os.close(fd)
    return pid, stdin_w, out_r, err_r


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


def _run(request):
    started = time.monotonic()
    deadline = started + request["timeout_s"]
    drain_until = None  # once the program exits, descendants may still hold its pipes
    pid, stdin_w, out_r, err_r = _start(request)
    out, err = _Stream(request["max_output_bytes"]), _Stream(request["max_output_bytes"])
    open_streams = {out_r: out, err_r: err}
    data = request["stdin"].encode()
    if data:
        os.set_blocking(stdin_w, False)
    else:
        os.close(stdin_w)
        stdin_w = None
    flood_bound = request["max_output_bytes"] + request["overflow_bytes"]
    reason, exited = None, None
    while open_streams:
        now = time.monotonic()
        if exited is None:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                exited, drain_until = (status, usage), now + PIPE_GRACE_S
            elif now >= deadline:
                reason = "timeout"
                break
        elif now >= drain_until:
            break
        until = deadline if exited is None else drain_until
        writers = [stdin_w] if stdin_w is not None else []
        readable, writable, _ = select.select(list(open_streams), writers, [],
                                              max(min(until - now, POLL_S), 0))
        for fd in readable:
            chunk = os.read(fd, CHUNK)
            if chunk:
                open_streams[fd].add(chunk)
            else:
                del open_streams[fd]
        if writable:
            try:
                data = data[os.write(stdin_w, data[:CHUNK]):]
            except BrokenPipeError:
                data = b""
            if not data:
                os.close(stdin_w)
                stdin_w = None
        if exited is None and max(out.total, err.total) > flood_bound:
            reason = "output_limit"
            break
    _kill_sandbox_user(request["uid"])
    if exited is None:
        _, status, usage = os.wait4(pid, 0)
        exited = (status, usage)
    wall = time.monotonic() - started
    for fd in (stdin_w, out_r, err_r):
        if fd is not None:
            os.close(fd)
    status, usage = exited
    return {
        "wait_status": status, "reason": reason,
        "stdout": out.head.decode("utf-8", "replace"),
        "stderr": err.head.decode("utf-8", "replace"),
        "stdout_truncated": out.total > out.limit, "stderr_truncated": err.total > err.limit,
        "stderr_tail": err.tail.decode("utf-8", "replace"),
        "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
    }


def _in_helper(uid, work):
    """Run `work` in a child that has become the sandbox user; True if it succeeded."""
    pid = os.fork()
    if pid == 0:
        try:
            _as_sandbox_user(uid)
            work()
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _kill_sandbox_user(uid):
    def kill_all():
        # Repeat until none is left: a forking program can add processes during a sweep, and
        # the pids limit bounds how long it can keep that up. (kill(-1) cannot tell: it also
        # "succeeds" when it only reached processes it may not signal.)
        for _ in range(1000):
            alive = _live_processes_of(uid) - {os.getpid()}
            if not alive:
                return
            for pid in alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.001)
        raise RuntimeError("sandbox processes keep appearing")

    return _in_helper(uid, kill_all)


def _live_processes_of(uid):
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat("/proc/" + name).st_uid != uid:
                continue
            with open("/proc/" + name + "/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.add(int(name))
    return found


def _empty_workdirs(uid):
    def empty():
        for root in WORKDIRS:
            for name in os.listdir(root):
                _remove(os.path.join(root, name))

    return _in_helper(uid, empty)


def _remove(path):
    mode = os.lstat(path).st_mode
    if stat.S_ISDIR(mode):
        os.chmod(path, 0o700)  # the program may have taken away its own permissions
        for name in os.listdir(path):
            _remove(os.path.join(path, name))
        os.rmdir(path)
    else:
        os.unlink(path)


def _reap_orphans():
    """Processes the program left behind were re-parented to init (pid 1), not to us; our own
    helpers are waited for. Collect anything else that is ours."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    for line in sys.stdin:
        request = json.loads(line)
        response = _run(request)
        response["clean"] = (_kill_sandbox_user(request["uid"])
                             and _empty_workdirs(request["uid"]))
        _reap_orphans()
        sys.stdout.write(json.dumps(response) + "\n")
        sys.stdout.flush()


main()
