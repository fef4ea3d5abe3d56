"""The sandbox launcher: a warm interpreter that forks each program, for both backends.

Starting Python costs about 10 ms of CPU, most of a trivial program's price, so the agent keeps
one interpreter per slot already started (with the flags and `site` a program gets) and forks
it for every program: the fork sets the program up (its own session, uid, rlimits, files,
pipes; the sandbox around it is the backend's) and then runs the code in place, or `exec`s
bash. The launcher never sees a program's code, input or output: the forked child reads its
request from a pipe of its own, so the memory every later program inherits holds nothing of an
earlier one.

Started by the agent as root, from source on the command line:
    python -E -s -c <this source>      fd 3: a SOCK_SEQPACKET socket to the agent
Per program the agent sends b"run" with five descriptors: the request pipe, stdin, stdout,
stderr and a status pipe. The launcher answers the child's pid, then "<wait status> <cpu
seconds>" once it has exited. A child that cannot start writes {"kind": "input" | "sandbox",
"message"} to the status pipe; the program never holds that pipe, so it cannot pass itself off
as a failed start. Standard library only, like the agent.
"""

import base64
import builtins
import contextlib
import ctypes
import gc
import json
import os
import resource
import signal
import socket
import sys
import types

START_FAILED_EXIT = 125
WORKDIR = "/work"
AGENT_FD = 3
PROGRAM_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
# The interpreter's command line, as a program sees it: -E -s rather than -I, so the workdir
# is on sys.path and programs import the files they bring.
PYTHON_FLAGS = ("-E", "-s")
SCRIPTS = {"python": "main.py", "bash": "main.sh"}

PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38

libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """The sandbox could not set the program up."""


class InputError(Exception):
    """The request's files cannot be written as asked."""


def _check(result, what):
    if result != 0:
        raise SetupError(f"{what}: {os.strerror(ctypes.get_errno())}")


def _as_user(uid):
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _read_request(fd):
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    os.close(fd)
    return json.loads(b"".join(chunks))


def _set_up(request_fd, stdin_fd, stdout_fd, stderr_fd, status_fd):
    """In the forked child, as root: everything but the program itself. Returns the language
    and the script."""
    for fd, target in ((stdin_fd, 0), (stdout_fd, 1), (stderr_fd, 2)):
        os.dup2(fd, target)
        os.close(fd)
    request = _read_request(request_fd)
    os.setsid()
    # When memory runs out, the kernel kills the program, not the agent.
    with open("/proc/self/oom_score_adj", "w") as fh:
        fh.write("1000")
    uid = request["uid"]
    if uid is not None:
        _as_user(uid)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
    if not (
        os.access(sys.executable, os.X_OK)
        and os.access(os.path.dirname(os.__file__), os.R_OK | os.X_OK)
    ):
        raise SetupError(f"the sandbox user cannot use the interpreter {sys.executable}")
    os.chdir(WORKDIR)
    script = SCRIPTS[request["language"]]
    with open(script, "w", encoding="utf-8") as fh:
        fh.write(request["code"])
    for item in request["files"]:
        try:
            if os.path.dirname(item["path"]):
                os.makedirs(os.path.dirname(item["path"]), exist_ok=True)
            with open(item["path"], "wb") as fh:
                fh.write(base64.b64decode(item["data"]))
        except OSError as exc:
            raise InputError(
                f"the file {item['path']!r} cannot be written in the workdir: {exc.strerror}"
            ) from exc
    for name, (soft, hard) in request["limits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    os.closerange(3, status_fd)
    os.closerange(status_fd + 1, 65536)
    os.set_inheritable(status_fd, False)  # closed by a successful exec, kept by a failed one
    os.environ.clear()
    os.environ.update(PROGRAM_ENV, HOME=WORKDIR)
    return request["language"], os.path.abspath(script)


def _launch(fds):
    """The forked child: set up, then become the program. Never returns."""
    status_fd = fds[4]
    try:
        language, script = _set_up(*fds)
        if language == "bash":
            os.execve("/bin/bash", ["/bin/bash", script], dict(os.environ))
    except BaseException as exc:  # noqa: BLE001 - a child that failed to start must not return
        kind = "input" if isinstance(exc, InputError) else "sandbox"
        with contextlib.suppress(OSError):
            os.write(status_fd, json.dumps({"kind": kind, "message": str(exc)}).encode())
        os._exit(START_FAILED_EXIT)
    os.close(status_fd)
    _run_python(script)
    raise SystemExit  # the program's end: the interpreter's own exit, never back to serve()


def _run_python(script):
    """Run the script as `python -E -s main.py` would. Its exceptions, SystemExit included,
    leave through the interpreter's own exit path: tracebacks, exit codes, atexit, thread joins
    and flushing are the interpreter's."""
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=script, __builtins__=builtins, __cached__=None)
    sys.modules["__main__"] = module
    sys.argv[:] = [os.path.basename(script)]
    sys.orig_argv[:] = [sys.orig_argv[0], *PYTHON_FLAGS, os.path.basename(script)]
    sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
    sys.excepthook = _program_excepthook
    with open(script, "rb") as fh:
        code = compile(fh.read(), script, "exec")
    exec(code, module.__dict__)  # noqa: S102 - running the program is the point


def _program_excepthook(kind, value, tb):
    """Tracebacks start at the program, as if the launcher's frames were not there."""
    while tb is not None and tb.tb_frame.f_code.co_filename == LAUNCHER_FILENAME:
        tb = tb.tb_next
    sys.__excepthook__(kind, value.with_traceback(tb), tb)  # it prints the exception's own


LAUNCHER_FILENAME = _program_excepthook.__code__.co_filename  # "<string>" when run with -c


def serve(agent):
    agent.send(b"ready")
    while True:
        message, fds, _, _ = socket.recv_fds(agent, 16, 5)
        if not message:
            return  # the agent is gone
        pid = os.fork()
        if pid == 0:
            agent.close()
            _launch(fds)
        for fd in fds:
            os.close(fd)
        agent.send(str(pid).encode())
        _, status, usage = os.wait4(pid, 0)
        agent.send(f"{status} {usage.ru_utime + usage.ru_stime}".encode())


if __name__ == "__main__":
    # Root must not import from wherever it stands; a program gets its workdir at the front.
    sys.path = [p for p in sys.path if p not in ("", os.getcwd())]
    # What exists now is never collected: a program's collections leave these pages shared.
    gc.freeze()
    serve(socket.socket(fileno=AGENT_FD))
