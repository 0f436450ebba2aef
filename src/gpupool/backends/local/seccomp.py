"""The syscall policy of a local member's sandbox: a classic BPF program that bubblewrap installs (`--seccomp FD`)
before it runs the member, for everything the member and its builds run.

Modelled on the default seccomp profile of Docker and containerd (moby's profiles/seccomp/default.json), for a
process with no capabilities: that profile allows a syscall that needs a capability only where the capability is
granted, and a member has none. What it refuses here is the kernel surface a root-equivalent tenant would use to
leave its namespaces or reach the host's kernel:
- namespaces and mounts: unshare, setns, clone with any CLONE_NEW* flag, mount and the new mount API (fsopen,
  fsmount, move_mount, open_tree, ...), pivot_root, chroot. No user namespace, so no capability anywhere: an
  `unshare -Urm` that would give the member root in a namespace of its own fails with EPERM;
- file handles, which reach files by inode past every mount (open_by_handle_at, the shocker escape);
- the kernel's keyring, BPF, perf events, userfaultfd, io_uring (refused by containerd since 2023), modules,
  kexec, swap, reboot, accounting, quotas, the clocks, syslog, the I/O port syscalls;
- clone3, answered ENOSYS (as Docker does): its flags are in memory a filter cannot read, and glibc falls back to
  clone, whose flags it can;
- fanotify, vsock sockets (the hypervisor's and the host's vsock services), and every syscall newer than the policy
  (FUTURE, answered ENOSYS: a deny-list would let a new kernel's calls through unweighed).
ptrace and process_vm_* stay allowed as in Docker's profile (kernels since 4.8 check them against the caller's
namespace and identity): a member may debug its own processes, and sees no others. Any other architecture's call
(the x32 ABI, a 32-bit one) is refused outright.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import struct
from pathlib import Path

# Classic BPF opcodes (linux/filter.h) and seccomp's return values (linux/seccomp.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_ALLOW = 0x7FFF0000
_KILL_PROCESS = 0x80000000
_ERRNO = 0x00050000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (args[0]'s low word: little-endian hosts)
CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
"""CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID and NEWNET (CLONE_NEWTIME is 0x80, a signal's bits in
clone's flags, and only unshare takes it)."""
X32_BIT = 0x40000000

_COMMON = {  # the same numbers on x86_64 and arm64 (the new mount API, io_uring, clone3)
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "quotactl_fd": 443,
    "open_tree_attr": 467,
}  # fmt: skip
FUTURE = 470
"""The first syscall number this policy does not know (x86_64 and arm64 share the numbers from 424 on): one from a
newer kernel answers ENOSYS, as under an allow-list, until the policy has weighed it."""
SOCKET = {"x86_64": 41, "aarch64": 198}
AF_VSOCK = 40
"""A socket of this family reaches the hypervisor and the host's vsock services: refused, as Docker refuses it."""
_X86_64 = _COMMON | {
        "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308,
        "open_by_handle_at": 304, "name_to_handle_at": 303, "keyctl": 250, "add_key": 248, "request_key": 249,
        "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "kexec_load": 246, "kexec_file_load": 320,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "swapon": 167, "swapoff": 168,
        "reboot": 169, "acct": 163, "lookup_dcookie": 212, "quotactl": 179, "settimeofday": 164,
        "clock_settime": 227, "adjtimex": 159, "clock_adjtime": 305, "syslog": 103, "vhangup": 153, "iopl": 172,
        "ioperm": 173, "uselib": 134, "ustat": 136, "sysfs": 139, "_sysctl": 156, "nfsservctl": 180,
        "create_module": 174, "get_kernel_syms": 177, "query_module": 178, "fanotify_init": 300,
        "modify_ldt": 154,
}  # fmt: skip
_AARCH64 = _COMMON | {
        "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268,
        "open_by_handle_at": 265, "name_to_handle_at": 264, "keyctl": 219, "add_key": 217, "request_key": 218,
        "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "kexec_load": 104, "kexec_file_load": 294,
        "init_module": 105, "finit_module": 273, "delete_module": 106, "swapon": 224, "swapoff": 225,
        "reboot": 142, "acct": 89, "lookup_dcookie": 18, "quotactl": 60, "settimeofday": 170,
        "clock_settime": 112, "adjtimex": 171, "clock_adjtime": 266, "syslog": 116, "vhangup": 58,
        "nfsservctl": 42, "fanotify_init": 262,
}  # fmt: skip
ARCHES: dict[str, tuple[int, dict[str, int]]] = {"x86_64": (0xC000003E, _X86_64), "aarch64": (0xC00000B7, _AARCH64)}
CLONE = {"x86_64": 56, "aarch64": 220}
CLONE3 = 435


class Unsupported(Exception):
    """This host's architecture has no policy here."""


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> tuple[int, int, int, int]:
    return (code, jt, jf, k)


def program(machine: str | None = None) -> bytes:
    """The compiled filter for `machine` (this host's by default), as bubblewrap reads it."""
    arch = machine or platform.machine()
    if arch not in ARCHES:
        raise Unsupported(f"no syscall policy for {arch} (x86_64 and aarch64 have one)")
    audit, table = ARCHES[arch]
    denied = sorted(set(table.values()))
    # Layout: arch check, nr load, [x32], future, one jump per denied nr, clone3, socket, clone; then allow,
    # clone's flag check, allow, deny (EPERM), nosys (ENOSYS), socket's family check, allow, deny (EPERM).
    # Jumps count the instructions skipped.
    head: list[tuple[int, int, int, int]] = [
        _ins(_LD_W_ABS, _ARCH),
        _ins(_JEQ_K, audit, 1, 0),
        _ins(_RET_K, _KILL_PROCESS),
        _ins(_LD_W_ABS, _NR),
    ]
    checks = len(denied) + 4 + (1 if arch == "x86_64" else 0)
    # after the checks: [0] allow, [1] ld arg0, [2] jset, [3] allow, [4] deny, [5] nosys, [6] ld arg0, [7] jeq,
    # [8] allow, [9] deny
    body: list[tuple[int, int, int, int]] = []

    def to(target: int) -> int:  # from the instruction about to be appended, to slot `target` after the checks
        return checks - len(body) - 1 + target

    if arch == "x86_64":
        body.append(_ins(_JGE_K, X32_BIT, to(4), 0))
    body.append(_ins(_JGE_K, FUTURE, to(5), 0))
    for nr in denied:
        body.append(_ins(_JEQ_K, nr, to(4), 0))
    body.append(_ins(_JEQ_K, CLONE3, to(5), 0))
    body.append(_ins(_JEQ_K, SOCKET[arch], to(6), 0))
    body.append(_ins(_JEQ_K, CLONE[arch], to(1), to(0)))
    tail = [
        _ins(_RET_K, _ALLOW),
        _ins(_LD_W_ABS, _ARG0),
        _ins(_JSET_K, CLONE_NEW, 1, 0),
        _ins(_RET_K, _ALLOW),
        _ins(_RET_K, _ERRNO | errno.EPERM),
        _ins(_RET_K, _ERRNO | errno.ENOSYS),
        _ins(_LD_W_ABS, _ARG0),
        _ins(_JEQ_K, AF_VSOCK, 1, 0),
        _ins(_RET_K, _ALLOW),
        _ins(_RET_K, _ERRNO | errno.EPERM),
    ]
    # jset's targets: deny (2 ahead counting from the next instruction: allow, deny) -> jt=1 skips allow.
    return b"".join(struct.pack("<HBBI", *i) for i in (*head, *body, *tail))


def oci_profile(machine: str | None = None) -> dict[str, object]:
    """The same policy as an OCI seccomp profile (the JSON podman's `--security-opt seccomp=` reads), so a member
    in an image is refused what a member without one is: podman's own default profile allows unshare, setns,
    mount and clone with namespace flags, for nested containers."""
    arch = machine or platform.machine()
    if arch not in ARCHES:
        raise Unsupported(f"no syscall policy for {arch} (x86_64 and aarch64 have one)")
    names = sorted(set(ARCHES[arch][1]))
    deny = {"action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}
    rules: list[dict[str, object]] = [{"names": names, **deny}, {"names": ["clone3"], "action": "SCMP_ACT_ERRNO",
                                                                 "errnoRet": errno.ENOSYS}]  # fmt: skip
    vsock = {"index": 0, "value": AF_VSOCK, "op": "SCMP_CMP_EQ"}
    rules.append({"names": ["socket"], "args": [vsock], **deny})
    for bit in (1 << b for b in range(32) if CLONE_NEW & (1 << b)):  # denied where any namespace bit is set
        arg = {"index": 0, "value": bit, "valueTwo": bit, "op": "SCMP_CMP_MASKED_EQ"}
        rules.append({"names": ["clone"], "args": [arg], **deny})
    return {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": rules}


def write_oci(path: Path) -> Path:
    """oci_profile in a file of the server's, for podman (which runs as root)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(oci_profile(), f)
    tmp.replace(path)
    return path


def write(path: Path) -> Path:
    """The filter in a file of the server's (600), which the sandbox's command opens for bubblewrap."""
    data = program()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)
    return path
