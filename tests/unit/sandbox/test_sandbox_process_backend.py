"""The process backend against real child processes: isolation, limits and status mapping."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.sandbox.process_backend import ProcessBackend
from services.sandbox.schemas import ExecuteRequest, ExecutionStatus
from services.sandbox.settings import SandboxSettings
from services.sandbox.uid_ranges import processes_of

AS_ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
async def backend() -> AsyncIterator[ProcessBackend]:
    backend = ProcessBackend(SandboxSettings(sandbox_max_concurrency=4))
    await backend.start()
    yield backend
    await backend.aclose()


def _programs_running(backend: ProcessBackend) -> set[int]:
    """Host pids of processes whose real uid is one of the service's sandbox uids (a program's
    own pids are those of its sandbox's PID namespace, meaningless on the host)."""
    first, last = backend.describe()["uids"]
    return processes_of(range(first, last + 1))


async def test_hello_world(backend: ProcessBackend) -> None:
    result = await backend.execute(ExecuteRequest(code="print('hello, world')"))
    assert result.status is ExecutionStatus.ok
    assert result.exit_code == 0
    assert result.stdout == "hello, world\n"
    assert result.stderr == ""
    assert result.wall_s > 0 and result.cpu_s > 0


async def test_exit_code_is_reported(backend: ProcessBackend) -> None:
    result = await backend.execute(ExecuteRequest(code="import sys; sys.exit(3)"))
    assert (result.status, result.exit_code) == (ExecutionStatus.error, 3)


async def test_exception_gives_error_with_traceback(backend: ProcessBackend) -> None:
    result = await backend.execute(ExecuteRequest(code="def f():\n    return 1 / 0\nf()\n"))
    assert result.status is ExecutionStatus.error
    assert result.exit_code == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert "ZeroDivisionError" in result.stderr
    # The user's traceback only: none of the agent's or the launcher's frames.
    assert result.stderr.startswith('Traceback (most recent call last):\n  File "/work/main.py"')
    assert "<string>" not in result.stderr and "agent" not in result.stderr


async def test_a_program_sees_the_interpreter_a_script_gets(backend: ProcessBackend) -> None:
    """Forked from a warm launcher, a program still looks like `python -E -s main.py`."""
    code = (
        "import os, sys, __main__\n"
        "print(sys.argv, __name__, __file__, sys.path[0], os.getcwd())\n"
        "print(sys.orig_argv[1:], sys.flags.ignore_environment, sys.flags.no_user_site,\n"
        "      sys.flags.no_site, __main__.__dict__ is globals())\n"
        "print(sorted(os.environ))\n"
    )
    result = await backend.execute(ExecuteRequest(code=code))
    assert result.stdout.splitlines() == [
        "['main.py'] __main__ /work/main.py /work /work",
        "['-E', '-s', 'main.py'] 1 1 0 True",
        "['HOME', 'LANG', 'MKL_NUM_THREADS', 'OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'PATH', "
        "'TMPDIR']",
    ], result.stderr


async def test_a_syntax_error_is_reported_as_python_reports_it(backend: ProcessBackend) -> None:
    result = await backend.execute(ExecuteRequest(code="x = 1\nprint(x +)\n"))
    assert (result.status, result.exit_code) == (ExecutionStatus.error, 1)
    assert result.stderr.startswith('  File "/work/main.py", line 2\n'), result.stderr
    assert result.stderr.rstrip().endswith("SyntaxError: invalid syntax")


async def test_sys_exit_with_a_message(backend: ProcessBackend) -> None:
    result = await backend.execute(ExecuteRequest(code="import sys; sys.exit('bad input')"))
    assert (result.exit_code, result.stderr) == (1, "bad input\n")


async def test_the_interpreter_exits_as_usual(backend: ProcessBackend) -> None:
    """Threads are joined, atexit runs and files left open are flushed at the end."""
    code = (
        "import atexit, threading, time\n"
        "left_open = open('out.txt', 'w'); left_open.write('flushed at exit')\n"
        "atexit.register(lambda: print('atexit'))\n"
        "def late():\n    time.sleep(0.2); print('thread')\n"
        "threading.Thread(target=late).start()\n"
        "print('main')\n"
    )
    result = await backend.execute(ExecuteRequest(code=code, collect=["out.txt"]))
    assert result.stdout == "main\nthread\natexit\n", result.stderr
    assert result.files[0].data() == b"flushed at exit"


async def test_infinite_loop_times_out_and_its_process_group_is_killed(
    backend: ProcessBackend,
) -> None:
    code = (
        "import os, subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "while True:\n    pass\n"
    )
    started = time.monotonic()
    result = await backend.execute(ExecuteRequest(code=code, timeout_s=1.0))
    assert result.status is ExecutionStatus.timeout
    assert result.reason == "timeout"
    assert result.exit_code is None
    assert 1.0 <= result.wall_s < 5.0 and time.monotonic() - started < 6.0
    assert int(result.stdout) > 0  # the child had started
    assert not _programs_running(backend)


@pytest.mark.skipif(not AS_ROOT, reason="a uid per sandbox needs a root service")
async def test_processes_that_leave_the_group_are_killed_too(backend: ProcessBackend) -> None:
    code = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
        "                         start_new_session=True)\n"
        "print(child.pid)\n"
    )
    result = await backend.execute(ExecuteRequest(code=code))
    assert result.status is ExecutionStatus.ok
    assert int(result.stdout) > 0
    assert not _programs_running(backend)


async def test_memory_bomb_is_oom(backend: ProcessBackend) -> None:
    code = "blocks = []\nwhile True:\n    blocks.append(bytearray(10 * 1024 * 1024))\n"
    result = await backend.execute(ExecuteRequest(code=code, memory_mb=128))
    assert result.status is ExecutionStatus.oom
    assert "MemoryError" in result.stderr


async def test_output_flood_is_truncated_and_stopped_quickly(backend: ProcessBackend) -> None:
    code = "while True:\n    print('x' * 10000)\n"
    result = await backend.execute(ExecuteRequest(code=code, max_output_bytes=1000, timeout_s=60))
    assert result.status is ExecutionStatus.killed
    assert result.reason == "output_limit"
    assert result.stdout_truncated and len(result.stdout) == 1000
    assert result.wall_s < 10  # not the 60 s timeout


async def test_output_past_the_limit_is_drained_when_the_program_ends(
    backend: ProcessBackend,
) -> None:
    code = "import sys\nprint('y' * 200_000)\nsys.stderr.write('e' * 50_000)\n"
    result = await backend.execute(ExecuteRequest(code=code, max_output_bytes=100))
    assert result.status is ExecutionStatus.ok
    assert result.stdout == "y" * 100 and result.stdout_truncated
    assert result.stderr == "e" * 100 and result.stderr_truncated


async def test_network_is_unreachable(backend: ProcessBackend) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            server.accept()[0].close()  # reachable from the service itself
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        result = await backend.execute(ExecuteRequest(code=code))
        server.setblocking(False)
        with pytest.raises(BlockingIOError):  # no connection came from the sandbox
            server.accept()
    assert result.status is ExecutionStatus.error
    # The sandbox's loopback is its own: nothing listens there.
    assert "Connection refused" in result.stderr


async def test_service_environment_is_not_visible(
    backend: ProcessBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "loom-test-secret-5f1c2"
    monkeypatch.setenv("LOOM_TEST_SECRET", secret)
    code = (
        "import os\n"
        "print(sorted(os.environ))\n"
        "print(os.environ.get('LOOM_TEST_SECRET'))\n"
        "try:\n"
        "    print(open(f'/proc/{os.getppid()}/environ').read())\n"
        "except PermissionError:\n"
        "    print('denied')\n"
    )
    result = await backend.execute(ExecuteRequest(code=code))
    assert result.status is ExecutionStatus.ok
    assert secret not in result.stdout
    if AS_ROOT:  # the sandbox runs as another uid: the service's /proc entries are closed
        assert result.stdout.rstrip().endswith("denied")


async def test_writes_land_in_a_private_dir_that_vanishes(backend: ProcessBackend) -> None:
    code = (
        "import os\n"
        "print(sorted(os.listdir('.')), sorted(os.listdir('/tmp')))\n"
        "with open('out.txt', 'w') as f:\n    f.write('data')\n"
        "print(os.getcwd(), oct(os.stat('.').st_mode & 0o7777))\n"
    )
    first = await backend.execute(ExecuteRequest(code=code))
    assert first.status is ExecutionStatus.ok, first.stderr
    listing, where = first.stdout.splitlines()
    assert listing == "['main.py'] []"
    workdir, mode = where.split()
    assert (workdir, mode) == ("/work", "0o1777")  # root's and sticky: the program cannot lock it
    assert not (Path(workdir) / "out.txt").exists()  # a tmpfs of the sandbox's own
    again = await backend.execute(ExecuteRequest(code=code))
    assert again.stdout.splitlines()[0] == "['main.py'] []"


async def test_stdin_is_fed(backend: ProcessBackend) -> None:
    code = "import sys\nfor line in sys.stdin:\n    print(line.strip()[::-1])\n"
    result = await backend.execute(ExecuteRequest(code=code, stdin="abc\nhello\n"))
    assert result.stdout == "cba\nolleh\n"


async def test_large_stdin_the_program_ignores_does_not_hang(backend: ProcessBackend) -> None:
    result = await backend.execute(ExecuteRequest(code="print('done')", stdin="z" * 5_000_000))
    assert result.status is ExecutionStatus.ok and result.stdout == "done\n"


async def test_killed_by_a_signal(backend: ProcessBackend) -> None:
    code = "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n"
    result = await backend.execute(ExecuteRequest(code=code))
    assert result.status is ExecutionStatus.killed
    assert result.signal == 15 and result.exit_code is None


async def test_concurrency_is_limited_by_settings() -> None:
    backend = ProcessBackend(SandboxSettings(sandbox_max_concurrency=2))
    await backend.start()
    request = ExecuteRequest(code="import time; time.sleep(0.6)")
    started = time.monotonic()
    results = await asyncio.gather(*(backend.execute(request) for _ in range(4)))
    assert all(r.status is ExecutionStatus.ok for r in results)
    assert time.monotonic() - started >= 1.2  # two waves of two


async def test_an_interpreter_that_cannot_start_is_named_at_start_up(tmp_path: Path) -> None:
    backend = ProcessBackend(
        SandboxSettings(sandbox_max_concurrency=1, sandbox_python=str(tmp_path / "python3"))
    )
    with pytest.raises(RuntimeError, match="cannot start the interpreter .*python3"):
        await backend.start()
