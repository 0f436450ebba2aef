"""Enter a running member's sandbox as its project's identity, with nothing of the member's resolved as root.

`gpupool exec` runs this file as a script (`python -I -S enter.py PID:START UID SPEC_FD POLICY`), as root, on the
host: the server's own interpreter, loaded from the host's files, with every module it needs imported before it
touches the member. It opens the namespaces and the root of PID (the sandbox's first process, bubblewrap's own,
which the member cannot change), joins them with setns(2), forks (a PID namespace takes its children only), and in
the child drops to UID for good (no groups, no capabilities in any set, no_new_privs) before it looks up a single
path in the member's view, and installs the member's syscall policy (POLICY, seccomp.py's file): the working
directory and the command are resolved by the member's identity, under the member's filter, as the member would.

Why not nsenter and setpriv: nsenter `--root` changes to the member's root before it runs the next program, so
`setpriv` was looked up in the member's view, as root: a member that mounted its own over /usr/local/sbin (in a
user namespace of its own) got a root shell on the host. Here no program runs until the identity is the member's.

SPEC_FD is a memfd with {"cwd", "argv", "env"} (the member's environment, never this process's). START is PID's
start time as the server found it (`start_time`): a pid is a name that a process which ended leaves to the next, so
the process is pinned (a pidfd), checked to be the one found, and checked alive once everything of it is opened.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import sys

NAMESPACES = ("ipc", "uts", "net", "pid", "mnt")
"""The order nsenter uses: the mount namespace last, as it changes this process's root."""
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
LAST_CAP = 63
_LIBC = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def drop_to(uid: int) -> None:
    """Become `uid` (gid the same) with no supplementary groups, an empty bounding set, no capabilities and
    no_new_privs: nothing this process or its programs run can take root back."""
    for cap in range(LAST_CAP + 1):
        if _LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != errno.EINVAL:
            _check(-1, "dropping the bounding set")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # from root to another uid: the kernel clears the permitted and effective sets
    _check(_LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != uid or os.getgroups():
        raise OSError(errno.EPERM, "the identity did not change")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def confine(policy: bytes) -> None:
    """Install the member's syscall policy (seccomp.py), as bubblewrap installs it for the member: what an exec
    runs may no more than the member itself. Needs no_new_privs, which drop_to set."""
    buffer = ctypes.create_string_buffer(policy, len(policy))
    prog = _SockFprog(len(policy) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    _check(_LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "the syscall policy")


def stat(pid: int) -> tuple[int, int]:
    """`pid`'s parent and when it started (clock ticks since boot: with the pid, which process it is)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return int(fields[1]), int(fields[19])


def start_time(pid: int) -> int:
    return stat(pid)[1]


def pin(pid: int, start: int) -> int:
    """A pidfd of the process `pid` that started at `start`; ESRCH where that process has ended (the pid may name
    another by now)."""
    pidfd = os.pidfd_open(pid)
    try:
        if start_time(pid) != start:
            raise OSError(errno.ESRCH, "the member's sandbox has ended")
    except BaseException:
        os.close(pidfd)
        raise
    return pidfd


def still(pidfd: int) -> None:
    """ESRCH unless the pinned process is alive: what was opened by its pid since it was pinned is its own."""
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        raise OSError(errno.ESRCH, "the member's sandbox has ended") from None


def opened(pid: int, start: int, paths: list[str], flags: int) -> list[int]:
    """/proc/PID/<path> for each of `paths`, of the process that started at `start` and no other."""
    pidfd = pin(pid, start)
    fds: list[int] = []
    try:
        for path in paths:
            fds.append(os.open(f"/proc/{pid}/{path}", flags | os.O_CLOEXEC))
        still(pidfd)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    finally:
        os.close(pidfd)
    return fds


def enter(pid: int, start: int) -> None:
    """Join the namespaces and root of `pid`, the process that started at `start` (all opened before the first
    is joined)."""
    *fds, root = opened(pid, start, [*(f"ns/{ns}" for ns in NAMESPACES), "root"], os.O_RDONLY)
    for fd in fds:
        _check(_LIBC.setns(fd, 0), "joining the member's namespaces")
        os.close(fd)
    os.fchdir(root)
    os.chroot(".")
    os.close(root)


def _exec(argv: list[str], env: dict[str, str]) -> OSError:
    """execvpe's search of PATH, written out: os.execvpe imports a module on its first use, which would be
    looked up in the member's view (as the member, but a missing one would fail the exec). Returns the error
    where nothing could be run."""
    name = argv[0]
    places = [name] if "/" in name else [f"{d or '.'}/{name}" for d in env.get("PATH", "/usr/bin:/bin").split(":")]
    found: OSError | None = None
    for path in places:
        try:
            os.execve(path, argv, env)
        except OSError as e:
            if found is None and e.errno not in (errno.ENOENT, errno.ENOTDIR):
                found = e  # as execvp: a file there that cannot run says so, over a later "no such file"
    return found or OSError(errno.ENOENT, os.strerror(errno.ENOENT))


def main(args: list[str]) -> int:
    pid, start = (int(x) for x in args[0].split(":"))
    uid, spec_fd = int(args[1]), int(args[2])
    with open(args[3], "rb") as f:  # the server's own file, read before anything of the member's is joined
        policy = f.read()
    spec = json.loads(os.pread(spec_fd, os.fstat(spec_fd).st_size, 0))
    os.close(spec_fd)
    argv, env, cwd = list(spec["argv"]), dict(spec["env"]), str(spec["cwd"])
    try:
        enter(pid, start)
    except OSError as e:
        print(f"gpupool exec: cannot enter the member ({e.strerror})", file=sys.stderr, flush=True)
        return 126
    child = os.fork()
    if child == 0:  # in the member's PID namespace
        try:
            drop_to(uid)
            confine(policy)
        except OSError as e:
            os.write(2, f"gpupool exec: cannot take the member's identity ({e.strerror})\n".encode())
            os._exit(126)
        try:
            os.chdir(cwd)
        except OSError as e:
            os.write(2, f"gpupool exec: cannot enter {cwd}: {e.strerror}\n".encode())
        failed = _exec(argv, env)
        os.write(2, f"gpupool exec: {argv[0]}: {failed.strerror}\n".encode())
        os._exit(127 if failed.errno == errno.ENOENT else 126)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
