"""Shells into running members (exec, attach, port-forward), as the backends give them: what the API's websocket
endpoints pump frames to and from (see gpupool.api.routers.shell for the wire protocol).

A `ShellSession` is one live session on the backend's side. Its output arrives on `frames` as (channel, bytes),
fed by threads of the backend's (a process's pipes or PTY, a log file, the Kubernetes client's stream); the last
frame is always on channel EXIT. Its input goes through `write`, `close_stdin` and `resize`, which may block and
are called from worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import threading
from dataclasses import dataclass
from typing import Protocol

STDIN, STDOUT, STDERR, RESIZE, EXIT = 0, 1, 2, 3, 4
"""The one-byte channels of the wire protocol."""

CHUNK = 64 * 1024
Loop = asyncio.AbstractEventLoop


class ShellError(Exception):
    """A session the backend cannot open; the message is for the user."""


@dataclass(frozen=True, slots=True)
class ShellTarget:
    """A running member a caller may open a shell into (services.shell checked who may)."""

    workload_id: int
    workload: str
    project: str
    project_id: int
    alloc_id: str
    rank: int
    kind: str


class ShellSession:
    """A live session: output queued by the backend's threads for the event loop `loop`, input handed to the
    subclass."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.frames: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()

    def emit(self, channel: int, data: bytes) -> None:
        """From any thread."""
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody listens any more
            self._loop.call_soon_threadsafe(self.frames.put_nowait, (channel, data))

    def exit(self, code: int | None) -> None:
        self.emit(EXIT, b"" if code is None else str(code).encode())

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def close_stdin(self) -> None:
        """The client's input ended."""

    def resize(self, cols: int, rows: int) -> None:
        """The client's terminal changed size (sessions with a TTY)."""

    def close(self) -> None:
        """End the session (its process, its stream); the member itself runs on."""


class Shells(Protocol):
    """A backend's sessions; each call may block (it starts a process, or connects to the cluster)."""

    def exec(
        self, loop: Loop, target: ShellTarget, argv: list[str], tty: bool, size: tuple[int, int] | None = None
    ) -> ShellSession:
        """`size` (cols, rows): the terminal's from the start, so a command that reads it at once sees it."""
        ...

    def attach(self, loop: Loop, target: ShellTarget) -> ShellSession: ...

    def port_forward(self, loop: Loop, target: ShellTarget, port: int) -> ShellSession: ...


def shells_for(backend: object) -> Shells | None:
    """The shells of the server's backend, None where it has none (a spoke's members have none yet)."""
    from gpupool.backends.local.backend import LocalBackend

    for wrapper in ("inner", "home"):  # a leader's guard, then the fleet: the hub's own backend is what has shells
        backend = getattr(backend, wrapper, backend)

    if isinstance(backend, LocalBackend):
        from gpupool.backends.local.shell import LocalShells

        return LocalShells(backend)
    if type(backend).__name__ == "KubernetesBackend":  # not imported otherwise: the kubernetes client is optional
        from gpupool.backends.kubernetes.backend import KubernetesBackend
        from gpupool.backends.kubernetes.shell import KubeShells

        assert isinstance(backend, KubernetesBackend)
        return KubeShells(backend)
    return None


def status(returncode: int) -> int:
    """A process's exit status as a shell reports it: 128 + the signal that killed it."""
    return 128 - returncode if returncode < 0 else returncode


class ProcessSession(ShellSession):
    """A local process with pipes, or with a PTY whose master is `master` (its slave already given to it)."""

    def __init__(self, loop: Loop, proc: subprocess.Popen[bytes], master: int | None = None) -> None:
        super().__init__(loop)
        self.proc = proc
        self.master = master
        self._lock = threading.Lock()
        readers: list[tuple[int, int]] = []
        if master is not None:
            readers.append((master, STDOUT))
        else:
            assert proc.stdout is not None and proc.stderr is not None
            readers += [(proc.stdout.fileno(), STDOUT), (proc.stderr.fileno(), STDERR)]
        self._readers = [
            threading.Thread(target=self._read, args=(fd, ch), daemon=True, name=f"gpupool-shell-{proc.pid}-{ch}")
            for fd, ch in readers
        ]
        for t in self._readers:
            t.start()
        threading.Thread(target=self._wait, daemon=True, name=f"gpupool-shell-{proc.pid}").start()

    def _read(self, fd: int, channel: int) -> None:
        while True:
            try:
                data = os.read(fd, CHUNK)
            except OSError:  # EIO: a PTY whose every slave is closed
                return
            if not data:
                return
            self.emit(channel, data)

    def _wait(self) -> None:
        code = self.proc.wait()
        for t in self._readers:
            t.join(timeout=None if self.master is None else 2.0)  # a PTY may be held by an orphan: not forever
        self.exit(status(code))

    def write(self, data: bytes) -> None:
        with self._lock:
            if self.master is not None:
                os.write(self.master, data)
            elif self.proc.stdin is not None and not self.proc.stdin.closed:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()

    def close_stdin(self) -> None:
        with self._lock:
            if self.master is not None:
                os.write(self.master, b"\x04")  # EOF, as a terminal's ^D
            elif self.proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()

    def resize(self, cols: int, rows: int) -> None:
        if self.master is not None:
            import fcntl
            import struct
            import termios

            fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.proc.wait(10)
        if self.master is not None:
            with contextlib.suppress(OSError):
                os.close(self.master)
            self.master = None


def parse_resize(data: bytes) -> tuple[int, int] | None:
    """A resize frame's payload: JSON {"cols": C, "rows": R}; None where it is not that."""
    try:
        size = json.loads(data)
        return terminal_size(size["cols"], size["rows"])
    except (ValueError, TypeError, KeyError):
        return None


def terminal_size(cols: str | int | None, rows: str | int | None) -> tuple[int, int] | None:
    """A terminal's size (cols, rows) from its two numbers; None where they are not one."""
    try:
        c, r = int(cols or 0), int(rows or 0)
    except ValueError:
        return None
    return (c, r) if 0 < c < 65536 and 0 < r < 65536 else None
