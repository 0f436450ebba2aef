"""One thread that learns when any supervised process ends, however many there are.

Each process is watched through a pidfd (`os.pidfd_open`), which works for the server's own children and for
processes adopted after a restart (children of init by then) alike, and which names one process for good: a pid
reused after it ends is not mistaken for it. A pidfd reads as ready once its process has exited. The server's own
children are then reaped by their pid only (`Popen.poll`), never with `waitpid(-1)`: other code in the server runs
subprocesses of its own and waits for them itself.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Reaper:
    def __init__(self, ended: Callable[[str], None]) -> None:
        """`ended(key)` is called (on the reaper's thread) once the process watched under `key` has exited."""
        self._ended = ended
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = os.pipe()
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[str, subprocess.Popen[bytes] | None]] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpupool-reaper")
        self._thread.start()

    def watch(self, key: str, pidfd: int, child: subprocess.Popen[bytes] | None = None) -> None:
        """Watch the process `pidfd` names (the server's own `child`, or an adopted one); the reaper closes the
        pidfd once the process has ended. Open it (`os.pidfd_open`) before anything can reap the process, so the
        pid it names cannot have been reused by then."""
        with self._lock:
            if self._closed:
                os.close(pidfd)
                return
            self._watched[pidfd] = (key, child)
            # epoll_ctl from another thread is seen by a wait already under way: no wake-up is needed.
            self._epoll.register(pidfd, select.EPOLLIN)

    def watching(self) -> int:
        with self._lock:
            return len(self._watched)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join()
        with self._lock:
            for pidfd in self._watched:
                os.close(pidfd)
            self._watched.clear()
        self._epoll.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        while True:
            try:
                ready = self._epoll.poll()
            except InterruptedError:  # pragma: no cover - Python retries EINTR itself
                continue
            for fd, _ in ready:
                if fd == self._wake_r:
                    return
                with self._lock:
                    entry = self._watched.pop(fd, None)
                    if entry is None:
                        continue
                    self._epoll.unregister(fd)
                os.close(fd)
                key, child = entry
                if child is not None:
                    child.poll()  # reaps it: waitpid on its own pid, which exited
                try:
                    self._ended(key)
                except Exception:  # one bad callback must not end supervision for all
                    log.exception("reaper: handling the end of %s failed", key)
