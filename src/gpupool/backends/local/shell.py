"""Shells into local members: a command run inside the member's sandbox, its stdin and output, and TCP
connections made from within its network.

A sandboxed member (sandbox.py) runs under bubblewrap in PID, IPC, UTS and mount namespaces of its own (and a
network one for services), as its project's uid. An exec joins them: `nsenter` into the namespaces of the
member's first process inside the sandbox, then `setpriv` down to the project's uid and gid with no capabilities
and no_new_privs, then a small launcher (this server's Python, which the sandbox shows its members) that takes
the member's own environment and working directory and runs the command. The environment travels in a memfd,
never in argv (which every user of the host may read) nor in the environment of nsenter and setpriv (which run
as root: a workload's LD_PRELOAD must never reach them). The process joins the member's cgroups first, so its
CPU and memory count against the member's limits. A TTY is a pseudo-terminal of the sandbox's own /dev/pts, so
`tty` inside names it as the member would see it.

Unsandboxed (--single-user) servers run the command directly, as the server's user, in the workdir.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpupool.backends.local import enter, envs, images
from gpupool.backends.local.runs import RunDir
from gpupool.backends.local.sandbox import drop
from gpupool.backends.local.telemetry import Proc, processes, tree
from gpupool.backends.shell import CHUNK, STDOUT, Loop, ProcessSession, ShellError, ShellSession, ShellTarget

if TYPE_CHECKING:
    from gpupool.backends.local.backend import LocalBackend

_LAUNCHER = (
    "import json, os, sys\n"
    "spec = json.loads(os.read(int(sys.argv[1]), 1 << 24) or b'{}')\n"
    "os.close(int(sys.argv[1]))\n"
    "try:\n"
    "    os.chdir(spec['cwd'])\n"
    "except OSError as e:\n"
    "    print(f'gpupool exec: cannot enter {spec[\"cwd\"]}: {e.strerror}', file=sys.stderr)\n"
    "try:\n"
    "    os.execvpe(spec['argv'][0], spec['argv'], spec['env'])\n"
    "except OSError as e:\n"
    "    print(f'gpupool exec: {spec[\"argv\"][0]}: {e.strerror}', file=sys.stderr)\n"
    "    sys.exit(127 if isinstance(e, FileNotFoundError) else 126)\n"
)
_JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" 2>/dev/null; shift; done; shift; exec "$@"'
_TOOL_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
TIOCSPTLCK = 0x40045431
TIOCGPTPEER = 0x5441
FOLLOW_POLL_S = 0.1


class LocalShells:
    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self.sandboxed = backend.isolation.sandboxed
        self.runs = RunDir(backend.data_dir / "run")

    # -- exec ----------------------------------------------------------------------------------------------
    def exec(
        self, loop: Loop, target: ShellTarget, argv: list[str], tty: bool, size: tuple[int, int] | None = None
    ) -> ShellSession:
        wrapper = self._wrapper(target)
        if self.backend.sandbox.in_container(target.alloc_id):
            return self._exec_in_image(loop, target, argv, tty, size)
        if self.sandboxed:
            box, start = self._inside(target, wrapper)
            inner = self._member_process(target, box)
        else:
            box = inner = _first_child(wrapper)
            start = 0
        spec = {"cwd": str(self.backend.workdir(target.workload_id)), "argv": argv, "env": _environ(inner)}
        memfd = os.memfd_create("gpupool-exec", 0)  # not inheritable: passed to the launcher alone
        master = slave = None
        try:
            os.write(memfd, _json(spec))
            os.lseek(memfd, 0, os.SEEK_SET)
            if tty:
                master, slave = self._pty(box, start)
                _set_size(slave, size)
            if self.sandboxed:
                # The server's own Python and enter.py, from the host: nothing is looked up in the member's view
                # until the process is the member's identity (enter.py says why).
                uid = self.backend.sandbox.uid(target.project_id)
                policy = str(self.backend.sandbox.policy)
                cmd = [sys.executable, "-I", "-S", enter.__file__, f"{box}:{start}", str(uid), str(memfd), policy]
                cmd = [
                    "/bin/sh",
                    "-c",
                    _JOIN_CGROUPS,
                    "gpupool-exec",
                    *_cgroups(box, self.backend.sandbox.cgroup_name(target.alloc_id)),
                    "--",
                    *cmd,
                ]
            else:
                cmd = [sys.executable, "-I", "-c", _LAUNCHER, str(memfd)]
            proc = _spawn(cmd, slave, (memfd,))
        except BaseException:
            if master is not None:
                os.close(master)
            raise
        finally:
            os.close(memfd)
            if slave is not None:
                os.close(slave)
        return ProcessSession(loop, proc, master)

    def _exec_in_image(
        self, loop: Loop, target: ShellTarget, argv: list[str], tty: bool, size: tuple[int, int] | None
    ) -> ShellSession:
        """`podman exec` into the member's container (images.exec_argv): the runtime applies the container's own
        identity, confinement and environment. A TTY is podman's to make inside; ours is the host's, its size
        passed on by podman on each SIGWINCH that a resize sends it."""
        first = self._container_pid(target)
        marker = secrets.token_hex(16)
        workdir = str(self.backend.workdir(target.workload_id))
        container = images.name(target.alloc_id, self.backend.data_dir)
        cmd = images.exec_argv(container, self._identity(target), workdir, argv, tty, marker)
        master, slave = os.openpty() if tty else (None, None)
        try:
            if slave is not None:
                _set_size(slave, size)
            proc = _spawn(cmd, slave, ())
        except BaseException:
            if master is not None:
                os.close(master)
            raise
        finally:
            if slave is not None:
                os.close(slave)
        return _ImageExec(loop, proc, master, marker, _ns(first))

    def _pty(self, inner: int, start: int) -> tuple[int, int]:
        """A pseudo-terminal pair: of the sandbox's own devpts where it has one (so the member's view names it),
        else of the host's. `inner` is the sandbox's first process, which started at `start`."""
        if not self.sandboxed:
            return os.openpty()
        (master,) = enter.opened(inner, start, ["root/dev/pts/ptmx"], os.O_RDWR | os.O_NOCTTY)
        try:
            fcntl.ioctl(master, TIOCSPTLCK, struct.pack("i", 0))
            slave = fcntl.ioctl(master, TIOCGPTPEER, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
        except BaseException:
            os.close(master)
            raise
        return master, int(slave)

    # -- attach --------------------------------------------------------------------------------------------
    def attach(self, loop: Loop, target: ShellTarget) -> ShellSession:
        wrapper = self._wrapper(target)
        fifo = self.runs.member_stdin(target.alloc_id, wrapper)
        try:
            if fifo is None:
                raise FileNotFoundError(2, "its stdin is not open")
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise ShellError(f"{target.workload} (rank {target.rank}) takes no input here: {e.strerror}") from e
        os.set_blocking(fd, True)
        log = Path(self.backend.log_path(target.workload_id, target.rank))
        return _Attached(loop, self, target, wrapper, fd, log)

    # -- port-forward --------------------------------------------------------------------------------------
    def port_forward(self, loop: Loop, target: ShellTarget, port: int) -> ShellSession:
        wrapper = self._wrapper(target)
        if shutil.which("socat") is None:
            raise ShellError("port-forward needs socat on the server's host (Debian's socat)")
        relay = ["socat", "STDIO", f"TCP:127.0.0.1:{port}"]
        in_image = self.backend.sandbox.in_container(target.alloc_id)
        net: tuple[int, ...] = ()
        if self.sandboxed:
            # An image's network is its container's: the namespace of its first process, as podman reports it.
            if in_image:
                where = [f"--target={self._container_pid(target)}", "--net"]
            else:  # the sandbox's, opened from the process found and no other that took its pid since
                net = tuple(enter.opened(*self._inside(target, wrapper), ["ns/net"], os.O_RDONLY))
                where = [f"--net=/proc/self/fd/{net[0]}"]
            relay = ["nsenter", *where, *drop(self.backend.sandbox.uid(target.project_id)), *relay]
        try:
            proc = subprocess.Popen(
                relay, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_TOOL_ENV,
                close_fds=True, start_new_session=True, pass_fds=net,
            )  # fmt: skip
        finally:
            for fd in net:
                os.close(fd)
        return ProcessSession(loop, proc)

    # -- internals -----------------------------------------------------------------------------------------
    def _wrapper(self, target: ShellTarget) -> int:
        pid = self.backend.wrapper_pid(target.alloc_id)
        if pid is None:
            raise ShellError(f"{target.workload} (rank {target.rank}) does not run on this server")
        return pid

    def _container_pid(self, target: ShellTarget) -> int:
        pid = images.pid(images.name(target.alloc_id, self.backend.data_dir))
        if pid is None:
            raise ShellError(f"{target.workload} (rank {target.rank}) has not started its container yet; try again")
        return pid

    def _identity(self, target: ShellTarget) -> tuple[int, int]:
        """The uid and gid its container runs as (sandbox.py's rule): the project's, or the server's own."""
        if self.sandboxed:
            uid = self.backend.sandbox.uid(target.project_id)
            return uid, uid
        return os.geteuid(), os.getegid()

    def _inside(self, target: ShellTarget, wrapper: int) -> tuple[int, int]:
        """The member's sandbox's first process and its start time: bubblewrap's own (root's), which made the
        sandbox's namespaces and which nothing of the member's can move to others. An exec joins its namespaces
        and root, never those of a process of the member's (which could have made its own); by pid and start time
        (enter.opened), as its pid alone could name another process by the time it is used."""
        outer = _ns(wrapper)
        procs = processes()
        children: dict[int, list[int]] = {}
        for p in procs.values():
            children.setdefault(p.ppid, []).append(p.pid)
        level = [wrapper]
        while level:  # breadth first: the shallowest in another PID namespace is the sandbox's first
            for pid in sorted(level):
                if _ns(pid) not in (None, outer):
                    if _building(procs, pid, wrapper):
                        raise ShellError(
                            f"{target.workload} (rank {target.rank}) is still building its Python environment; "
                            "try again once it has started"
                        )
                    # Its start time, read after the pid was found: the pid still names a child of the parent it
                    # was found under, in another namespace, so the two name that process.
                    start = _started_under(pid, procs[pid].ppid)
                    if start is not None and _ns(pid) not in (None, outer):
                        return pid, start
            level = [c for pid in level for c in children.get(pid, ())]
        raise ShellError(f"{target.workload} (rank {target.rank}) has not started its command yet; try again")

    def _member_process(self, target: ShellTarget, box: int) -> int:
        """The member's first process of its own (its project's uid) under the sandbox's first: whose environment
        an exec is given (read as data only)."""
        uid = self.backend.sandbox.uid(target.project_id)
        children: dict[int, list[int]] = {}
        for p in processes().values():
            children.setdefault(p.ppid, []).append(p.pid)
        level = [box]
        while level:  # breadth first: the member itself, not one of its children
            for pid in sorted(level):
                if _uid(pid) == uid:
                    return pid
            level = [c for pid in level for c in children.get(pid, ())]
        raise ShellError(f"{target.workload} (rank {target.rank}) has not started its command yet; try again")


class _ImageExec(ProcessSession):
    """A `podman exec`: closed early, its command is ended too (podman leaves it running without its client)."""

    def __init__(
        self, loop: Loop, proc: subprocess.Popen[bytes], master: int | None, marker: str, namespace: str | None
    ) -> None:
        super().__init__(loop, proc, master)
        self.marker, self.namespace = marker, namespace

    def close(self) -> None:
        early = self.proc.poll() is None
        super().close()
        if early:
            procs = processes()
            for pid in images.marked(self.marker, self.namespace):
                for p in tree(procs, pid):
                    with contextlib.suppress(OSError):
                        os.kill(p.pid, signal.SIGKILL)


class _Attached(ShellSession):
    """A running member's output (its log, from now on) and its stdin (the FIFO its wrapper opened)."""

    def __init__(self, loop: Loop, shells: LocalShells, target: ShellTarget, wrapper: int, fd: int, log: Path) -> None:
        super().__init__(loop)
        self.shells, self.target, self.wrapper, self.fd, self.log = shells, target, wrapper, fd, log
        self._done = threading.Event()
        try:  # from now on, as the session opens: what the member answers to its input comes after this
            offset = self.log.stat().st_size
        except OSError:
            offset = 0
        threading.Thread(
            target=self._follow, args=(offset,), daemon=True, name=f"gpupool-attach-{target.alloc_id}"
        ).start()

    def _follow(self, offset: int) -> None:
        while not self._done.is_set():
            running = self.shells.backend.wrapper_pid(self.target.alloc_id) == self.wrapper
            offset = self._drain(offset)
            if not running:
                self._drain(offset)
                self.exit(self.shells.runs.exit_code(self.target.alloc_id))
                return
            time.sleep(FOLLOW_POLL_S)

    def _drain(self, offset: int) -> int:
        with contextlib.suppress(OSError), open(self.log, "rb") as f:
            f.seek(offset)
            while chunk := f.read(CHUNK):
                self.emit(STDOUT, chunk)
                offset += len(chunk)
        return offset

    def write(self, data: bytes) -> None:
        try:
            os.write(self.fd, data)
        except BrokenPipeError as e:  # the member ended
            raise ShellError("the member has ended") from e

    def close(self) -> None:
        self._done.set()
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _set_size(fd: int, size: tuple[int, int] | None) -> None:
    if size is not None:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))


def _spawn(cmd: list[str], slave: int | None, fds: tuple[int, ...]) -> subprocess.Popen[bytes]:
    """A session's process in a session of its own: with `slave` as its controlling terminal and every stdio, or
    with pipes."""
    if slave is not None:
        return subprocess.Popen(
            ["setsid", "--ctty", *cmd], stdin=slave, stdout=slave, stderr=slave, env=_TOOL_ENV, pass_fds=fds,
            close_fds=True,
        )  # fmt: skip
    return subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_TOOL_ENV, pass_fds=fds,
        close_fds=True, start_new_session=True,
    )  # fmt: skip


def _json(value: object) -> bytes:
    import json

    return json.dumps(value).encode()


def _building(procs: dict[int, Proc], pid: int, wrapper: int) -> bool:
    """Whether `pid` is a step of the member's environment build (envs.py runs it, then becomes the member)."""
    builder = [os.fsencode(sys.executable), b"-I", os.fsencode(envs.__file__)]
    while pid != wrapper and pid in procs:
        pid = procs[pid].ppid
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:3] == builder:
                return True
    return False


def _ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _started_under(pid: int, parent: int) -> int | None:
    """The start time of `pid` where it is still a child of `parent`, else None."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        ppid, start = enter.stat(pid)
        if ppid == parent:
            return start
    return None


def _uid(pid: int) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    return None


def _first_child(pid: int) -> int:
    kids = sorted(p.pid for p in processes().values() if p.ppid == pid)
    return kids[0] if kids else pid


def _environ(pid: int) -> dict[str, str]:
    """A process's environment as it started (root reads any process's)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError as e:
        raise ShellError("the member ended") from e
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq and key:
            env[key.decode(errors="surrogateescape")] = value.decode(errors="surrogateescape")
    return env


def _cgroups(pid: int, name: str) -> list[str]:
    """The cgroup.procs files of the member's own cgroups (the ones of its `name`, Sandbox.cgroup_name), as
    /proc/<pid>/cgroup lists them."""
    out: list[str] = []
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if path.rsplit("/", 1)[-1] != name:
                continue
            base = Path("/sys/fs/cgroup") if not controllers else Path("/sys/fs/cgroup") / controllers
            procs = base / path.lstrip("/") / "cgroup.procs"
            if procs.exists():
                out.append(str(procs))
    return sorted(set(out))
