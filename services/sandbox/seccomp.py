"""The process backend's seccomp filter: classic BPF, given to bubblewrap (`--seccomp FD`),
which installs it last, after its own mounts, for the agent and everything it starts.

It refuses (EPERM) what a sandboxed program has no use for and what the kernel's attack
surface for privilege escalation mostly goes through: creating user namespaces (`clone` or
`unshare` with CLONE_NEWUSER), `ptrace` and reading other processes' memory, the keyring,
every mount call, joining namespaces, kernel modules, `bpf`, `perf_event_open`, `kexec`,
`userfaultfd`. `clone3` answers ENOSYS, since BPF cannot read its flags (they are behind a
pointer): the C library then falls back to `clone`, whose flags it can check. A syscall of
another architecture (32-bit calls on x86-64) kills the process, as the numbers below would
not mean the same calls.

Written out by hand, not with libseccomp: the filter is twenty lines of BPF, and the
service then needs no compiled binding.
"""

from __future__ import annotations

import errno
import platform
import struct

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000
CLONE_NEWUSER = 0x10000000

# name: (x86_64, aarch64)
DENIED = {
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "setns": (308, 268),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
}
FLAG_CHECKED = {"clone": (56, 220), "unshare": (272, 97)}  # flags in the first argument
CLONE3 = 435

# struct sock_filter {u16 code; u8 jt; u8 jf; u32 k}; seccomp_data {int nr; u32 arch; ...}
LD_ABS_W, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
NR_OFFSET, ARCH_OFFSET, ARG0_LOW_OFFSET = 0, 4, 16  # little-endian: low half first
RET_ALLOW, RET_KILL_PROCESS, RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000


def machine() -> str:
    return platform.machine()


def supported() -> bool:
    return machine() in AUDIT_ARCH


def filter_bytes() -> bytes:
    """The filter for this machine's architecture, as bubblewrap reads it."""
    arch = machine()
    if arch not in AUDIT_ARCH:
        raise RuntimeError(f"no seccomp filter for the {arch} architecture")
    column = 0 if arch == "x86_64" else 1
    deny_eperm = RET_ERRNO | errno.EPERM
    # Instructions as (code, jump-if-true label, jump-if-false label, k); labels resolved below.
    program: list[tuple[int, str | int, str | int, int]] = [
        (LD_ABS_W, 0, 0, ARCH_OFFSET),
        (JEQ, "arch_ok", "kill", AUDIT_ARCH[arch]),
    ]
    labels = {"arch_ok": len(program)}
    program.append((LD_ABS_W, 0, 0, NR_OFFSET))
    if arch == "x86_64":
        program.append((JGE, "kill", 0, X32_SYSCALL_BIT))
    for numbers in DENIED.values():
        program.append((JEQ, "eperm", 0, numbers[column]))
    program.append((JEQ, "enosys", 0, CLONE3))
    for numbers in FLAG_CHECKED.values():
        program.append((JEQ, "check_flags", 0, numbers[column]))
    program.append((RET, 0, 0, RET_ALLOW))
    labels["check_flags"] = len(program)
    program += [
        (LD_ABS_W, 0, 0, ARG0_LOW_OFFSET),
        (JSET, "eperm", 0, CLONE_NEWUSER),
        (RET, 0, 0, RET_ALLOW),
    ]
    labels["eperm"] = len(program)
    program.append((RET, 0, 0, deny_eperm))
    labels["enosys"] = len(program)
    program.append((RET, 0, 0, RET_ERRNO | errno.ENOSYS))
    labels["kill"] = len(program)
    program.append((RET, 0, 0, RET_KILL_PROCESS))

    def offset(target: str | int, at: int) -> int:
        if isinstance(target, int):
            return target
        jump = labels[target] - (at + 1)
        assert 0 <= jump < 256, "a BPF jump reaches 255 instructions at most"
        return jump

    return b"".join(
        struct.pack("=HBBI", code, offset(jt, i), offset(jf, i), k)
        for i, (code, jt, jf, k) in enumerate(program)
    )
