"""Hostile programs. Each prints `ESCAPED: ...` if its attack worked; the suite checks that it
never does, that the service stays healthy and that nothing is left behind.

`@SECRET_FILE@`, `@TCP_PORT@`, `@UNIX_SOCKET@` and the rest are filled in from the bait
(`Bait.fill`)."""

from __future__ import annotations

from dataclasses import dataclass

from services.sandbox.schemas import ExecutionStatus as S


@dataclass(frozen=True)
class Hostile:
    name: str
    code: str
    statuses: frozenset[S]  # the acceptable outcomes
    # Programs meant to end on their own get room for a loaded machine; those meant to be
    # stopped get a short timeout (SPIN).
    timeout_s: float = 10.0
    memory_mb: int = 256
    stdout_has: str | None = None  # proof the program got as far as the attack


def hostile(name: str, code: str, *statuses: S, **options: object) -> Hostile:
    return Hostile(name, code.strip(), frozenset(statuses or (S.ok,)), **options)  # type: ignore[arg-type]


ANY_END = (S.ok, S.error, S.timeout, S.killed, S.oom)
SPIN = 2.0

PROGRAMS = [
    # -- processes ---------------------------------------------------------------------------
    hostile(
        "fork_bomb",
        """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
""",
        S.timeout,
        S.killed,
        S.error,
        timeout_s=SPIN,
    ),
    hostile(
        "shell_fork_bomb",
        """
import subprocess
subprocess.run(["bash", "-c", ":(){ :|:& };:"])
import time; time.sleep(30)
""",
        S.timeout,
        S.killed,
        S.error,
        timeout_s=SPIN,
    ),
    hostile(
        "thread_bomb",
        """
import threading, time
n = 0
try:
    while True:
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); n += 1
except Exception:
    print("threads", n)
time.sleep(30)
""",
        S.timeout,
        S.error,
        S.oom,
        S.killed,
        timeout_s=SPIN,
    ),
    hostile(
        "background_process_left_behind",
        """
import subprocess
subprocess.Popen(["sleep", "600"], start_new_session=True)
print("started")
""",
        stdout_has="started",
    ),
    hostile(
        "double_fork_daemon",
        """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(600)
    os._exit(0)
print("daemonized")
""",
        stdout_has="daemonized",
    ),
    hostile(
        "zombies",
        """
import os, time
for _ in range(20):
    if os.fork() == 0:
        os._exit(0)
time.sleep(0.2)
print("zombies made")
""",
        stdout_has="zombies made",
    ),
    hostile(
        "ignores_sigterm_and_spins",
        """
import signal
signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    pass
""",
        S.timeout,
        timeout_s=SPIN,
    ),
    hostile(
        "signal_every_process",
        """
import os, signal
killed = 0
for name in os.listdir("/proc"):
    if name.isdigit() and int(name) != os.getpid():
        try:
            os.kill(int(name), signal.SIGKILL); killed += 1
        except OSError:
            pass
for target in (1, os.getppid(), -1):
    try:
        os.kill(target, signal.SIGKILL)
    except OSError:
        pass
print("signalled", killed)
""",
        *ANY_END,
    ),
    hostile(
        "ptrace_the_parent",
        """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH = 16
if libc.ptrace(PTRACE_ATTACH, os.getppid(), 0, 0) == 0:
    print("ESCAPED: attached to the parent")
print("done")
""",
        stdout_has="done",
    ),
    hostile(
        "setuid_root",
        """
import os
for call in (lambda: os.setuid(0), lambda: os.setgid(0), lambda: os.setgroups([0])):
    try:
        call(); print("ESCAPED: became root")
    except OSError:
        pass
print("done")
""",
        stdout_has="done",
    ),
    # -- resources ---------------------------------------------------------------------------
    hostile(
        "memory_bomb",
        """
chunks = []
while True:
    chunks.append(bytearray(16 * 2**20))
""",
        S.oom,
        S.killed,
    ),
    hostile("one_huge_allocation", "x = bytearray(8 * 2**30)", S.oom, S.killed),
    hostile(
        "memory_bomb_in_a_child",
        """
import subprocess, sys
r = subprocess.run([sys.executable, "-c", "x = [bytearray(2**24) for _ in range(10**4)]"])
print("child ended", r.returncode)
""",
        S.ok,
        S.oom,
        S.killed,
        S.error,
    ),
    hostile("cpu_spin_past_timeout", "while True:\n    pass", S.timeout, timeout_s=SPIN),
    hostile(
        "cpu_spin_in_threads",
        """
import threading
def spin():
    while True:
        pass
for _ in range(4):
    threading.Thread(target=spin, daemon=True).start()
spin()
""",
        S.timeout,
        timeout_s=SPIN,
    ),
    hostile("sleeps_past_timeout", "import time\ntime.sleep(600)", S.timeout, timeout_s=SPIN),
    hostile("stdout_flood", "while True:\n    print('x' * 4096)", S.killed, S.ok),
    hostile(
        "stderr_flood", "import sys\nwhile True:\n    sys.stderr.write('y' * 65536)", S.killed, S.ok
    ),
    hostile(
        "flood_from_a_background_child",
        """
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "while True: print('z' * 4096)"])
print("parent done")
""",
        *ANY_END,
    ),
    hostile(
        "disk_fill_workdir",
        """
n = 0
try:
    with open("fill", "wb") as f:
        while True:
            f.write(b"x" * 2**20); f.flush(); n += 1
except OSError as exc:
    print("stopped after", n, "MiB:", exc)
""",
        S.ok,
        S.error,
        S.killed,
    ),
    hostile(
        "disk_fill_tmp",
        """
import os
n = 0
try:
    while True:
        with open(f"/tmp/fill{n}", "wb") as f:
            f.write(b"x" * 2**20)
        n += 1
except OSError as exc:
    print("stopped after", n, "MiB:", exc)
""",
        S.ok,
        S.error,
        S.killed,
    ),
    hostile(
        "open_files_until_it_fails",
        """
files = []
try:
    while True:
        files.append(open("/dev/null"))
except OSError as exc:
    print("stopped at", len(files), exc)
""",
        stdout_has="stopped at",
    ),
    # -- network -----------------------------------------------------------------------------
    hostile(
        "tcp_to_the_host_loopback",
        """
import socket
try:
    socket.create_connection(("127.0.0.1", @TCP_PORT@), timeout=1)
    print("ESCAPED: reached the host over TCP")
except OSError as exc:
    print("blocked", exc)
""",
        stdout_has="blocked",
    ),
    hostile(
        "udp_to_the_host_loopback",
        """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    s.sendto(b"hello", ("127.0.0.1", @UDP_PORT@))
    print("sent (must not arrive)")
except OSError as exc:
    print("blocked", exc)
""",
        *ANY_END,
    ),
    hostile(
        "tcp_egress",
        """
import socket
for host in ("1.1.1.1", "8.8.8.8", "172.17.0.1"):
    try:
        socket.create_connection((host, 53), timeout=1)
        print("ESCAPED: connected to", host)
    except OSError as exc:
        print("blocked", host, exc)
""",
        stdout_has="blocked 172.17.0.1",
    ),
    hostile(
        "udp_egress",
        """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1)
try:
    s.sendto(b"\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x07example\\x03com\\x00\\x00\\x01\\x00\\x01",
             ("8.8.8.8", 53))
    s.recvfrom(512)
    print("ESCAPED: got a UDP answer")
except OSError as exc:
    print("blocked", exc)
""",
        stdout_has="blocked",
    ),
    hostile(
        "dns_lookup",
        """
import socket
try:
    print("ESCAPED: resolved", socket.getaddrinfo("deb.debian.org", 80))
except OSError as exc:
    print("blocked", exc)
""",
        stdout_has="blocked",
    ),
    # -- files -------------------------------------------------------------------------------
    hostile(
        "read_the_service_secret_file",
        """
try:
    print("ESCAPED:", open("@SECRET_FILE@").read())
except OSError as exc:
    print("blocked", type(exc).__name__)
""",
        stdout_has="blocked",
    ),
    hostile(
        "read_system_secrets",
        """
for path in ("/etc/shadow", "/root/.bash_history", "/root/.ssh/id_rsa", "/etc/sudoers"):
    try:
        open(path).read(); print("ESCAPED: read", path)
    except OSError:
        pass
print("done")
""",
        stdout_has="done",
    ),
    hostile(
        "environment_secrets",
        """
import os
found = [k for k, v in os.environ.items() if "SECRET" in k or "KEY" in k or "TOKEN" in k]
print("own environment:", found)
for name in os.listdir("/proc"):
    if name.isdigit():
        try:
            data = open(f"/proc/{name}/environ", "rb").read()
        except OSError:
            continue
        if b"LOOM_TEST_SECRET_TOKEN" in data:
            print("ESCAPED: secret in the environment of pid", name)
print("done")
""",
        stdout_has="done",
    ),
    hostile(
        "write_outside_the_workdir",
        """
import os
for path in ("/etc/loom-escape", "/usr/loom-escape", "/loom-escape", "/root/loom-escape",
             "/var/loom-escape", "/opt/loom-escape"):
    try:
        with open(path, "w") as f:
            f.write("x")
        print("ESCAPED: wrote", path)
    except OSError:
        pass
print("done")
""",
        stdout_has="done",
    ),
    hostile(
        "leave_files_in_shared_temp_dirs",
        """
for path in ("/tmp/loom-escape", "/var/tmp/loom-escape", "/dev/shm/loom-escape",
             "/run/lock/loom-escape"):
    try:
        with open(path, "w") as f:
            f.write("x")
    except OSError:
        pass
print("done")
""",
        stdout_has="done",
    ),
    hostile(
        "lock_the_workdir",
        """
import os
os.makedirs("deep/er/est")
open("deep/er/est/file", "w").write("x")
os.chmod("deep/er/est", 0)
os.chmod("deep/er", 0)
os.chmod("deep", 0)
print("locked")
""",
        stdout_has="locked",
    ),
    # -- /proc and devices -------------------------------------------------------------------
    hostile(
        "proc_root_escape",
        """
import os
for path in ("/proc/1/root/etc/shadow", "/proc/1/root@SECRET_FILE@",
             f"/proc/{os.getppid()}/root@SECRET_FILE@", f"/proc/{os.getppid()}/cwd/x"):
    try:
        print("ESCAPED:", open(path).read()[:50])
    except OSError:
        pass
print("done")
""",
        stdout_has="done",
    ),
    hostile(
        "read_the_parent_memory",
        """
import os
for pid in (1, os.getppid()):
    try:
        with open(f"/proc/{pid}/mem", "rb") as f:
            f.read(16)
        print("ESCAPED: read the memory of", pid)
    except OSError:
        pass
print("done")
""",
        stdout_has="done",
    ),
    hostile(
        "kernel_knobs_and_devices",
        """
import os
for path in ("/proc/sysrq-trigger", "/proc/sys/kernel/hostname", "/sys/kernel/mm/ksm/run"):
    try:
        with open(path, "w") as f:
            f.write("b")
        print("ESCAPED: wrote", path)
    except OSError:
        pass
for device in ("/dev/mem", "/dev/kmsg", "/dev/sda", "/dev/vda"):
    try:
        open(device, "rb").read(1); print("ESCAPED: read", device)
    except OSError:
        pass
try:
    os.mknod("disk", 0o600 | 0o060000, os.makedev(8, 0)); print("ESCAPED: mknod")
except OSError:
    pass
print("done")
""",
        stdout_has="done",
    ),
    hostile(
        "host_unix_sockets",
        """
import socket
for path in ("@UNIX_SOCKET@", "@POSTGRES_SOCKET@", "/var/run/docker.sock", "/run/docker.sock",
             "/run/mysqld/mysqld.sock", "/var/run/postgresql/.s.PGSQL.5432"):
    try:
        socket.socket(socket.AF_UNIX).connect(path)
        print("ESCAPED: connected to", path)
    except OSError as exc:
        print("blocked", path, type(exc).__name__)
print("done")
""",
        stdout_has="done",
    ),
    hostile(
        "other_processes_in_proc",
        """
import os
try:
    print("ESCAPED: a host process:", open("/proc/@HOST_PID@/cmdline", "rb").read())
except OSError:
    pass
for name in os.listdir("/proc"):
    try:
        if b"@MARKER@" in open(f"/proc/{name}/cmdline", "rb").read():
            print("ESCAPED: found the host process as pid", name)
    except OSError:
        pass
print("sees", sum(name.isdigit() for name in os.listdir("/proc")), "processes; done")
""",
        stdout_has="done",
    ),
    hostile(
        "world_readable_host_files",
        """
for path in @WORLD_READABLE@:  # in the project, /var/tmp and the host's /tmp
    try:
        print("ESCAPED: read", path, open(path).read()[:40])
    except OSError:
        pass
print("done")
""",
        stdout_has="done",
    ),
    hostile(
        "create_a_user_namespace",
        """
import ctypes, subprocess
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER = 0x10000000
if libc.unshare(CLONE_NEWUSER) == 0:
    print("ESCAPED: unshare(CLONE_NEWUSER)")
for command in (["unshare", "-U", "true"], ["unshare", "-Ur", "true"]):
    try:
        if subprocess.run(command, capture_output=True).returncode == 0:
            print("ESCAPED:", command)
    except OSError:
        pass
print("done")
""",
        stdout_has="done",
    ),
    hostile(
        "user_namespace_then_mount",
        """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0:
    libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)
try:
    print("ESCAPED:", open("@SECRET_FILE@").read())
except OSError:
    pass
print("done")
""",
        stdout_has="done",
    ),
]
