"""A start-time forecast run whole in a forked child of the scheduler's process, so that it costs the loop a fork
(about 10-20 ms at 30,000 workloads, page tables only) instead of the forecast's own seconds of interpreter time.

Why a fork, not a worker fed over a pipe: the child gets the cycle's snapshot as it is in memory (copy on write),
where pickling it costs more than a cycle (1.1 s for the scale benchmark's 30,883 workloads). The child runs only
the pure core (no I/O, no locks another thread could hold: the core takes none), sends back one pickle of plain
tuples and leaves with `os._exit`, so none of the parent's finalisers, atexit hooks or connections run in it.
It runs at nice 10, so where cores are few the loop and the requests go first (measured: the cycles right after
a fork take as long as without one; at the same niceness they took up to 3x as long on 2 loaded cores). Its
collector is frozen at birth: a collection would otherwise walk (and so copy) every page of the parent's heap.
On Linux it dies with the thread that forked it (PR_SET_PDEATHSIG), so a killed server leaves no forecast behind;
a forecast that runs past `timeout_s` is killed and counts as failed.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import pickle
import signal
import sys
import time
from collections.abc import Mapping

from gpupool.core import SchedulerConfig
from gpupool.core.decision import PendingCode
from gpupool.core.forecast import Estimate, Forecast, Limits, runtimes_for
from gpupool.core.model import Snapshot
from gpupool.core.placement.memo import Memo
from gpupool.core.runtime_model import Basis, RuntimeModel

FORKED = hasattr(os, "fork")
"""Where the platform has no fork (Windows), the loop steps the forecast itself within its budget."""
_PR_SET_PDEATHSIG = 1
NICE = 10
"""The child's niceness: on a host with few cores it takes what the loop and the requests leave."""

Row = tuple[str, float | None, str, str | None, str, bool]


class ForecastProcess:
    """One forecast (with the runtimes `model` and the `declared` durations give) in a child process; `poll()`
    after each cycle collects it. Like a `Forecast` where the loop reads it: `now`, `done`, `steps`, `estimates()`."""

    def __init__(
        self,
        snapshot: Snapshot,
        model: RuntimeModel,
        declared: Mapping[str, float],
        config: SchedulerConfig,
        limits: Limits,
        *,
        timeout_s: float,
    ) -> None:
        self.now = snapshot.now
        self.done = False
        self.failed = False
        self.steps = 0
        self._estimates: dict[str, Estimate] = {}
        self._buffer = bytearray()
        self._started = time.monotonic()
        self._deadline = self._started + timeout_s
        self.wall_s = 0.0
        """Seconds from the fork until the forecast was read back (or given up)."""
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child; its outcome is read back by the parent
            os.close(read)
            _child(write, snapshot, model, declared, config, limits)
        os.close(write)
        os.set_blocking(read, False)
        self.pid, self._fd = pid, read

    def poll(self) -> bool:
        """Reads what the child has sent; True once the forecast is done (or has failed)."""
        if self.done:
            return True
        while True:
            try:
                chunk = os.read(self._fd, 1 << 20)
            except BlockingIOError:
                if time.monotonic() > self._deadline:
                    self._fail()
                    return True
                return False
            if not chunk:
                break
            self._buffer.extend(chunk)
        os.close(self._fd)
        _, status = os.waitpid(self.pid, 0)
        self.pid = 0
        if os.waitstatus_to_exitcode(status) != 0 or not self._buffer:
            self.failed = self.done = True
            self.wall_s = time.monotonic() - self._started
            return True
        steps, rows = pickle.loads(self._buffer)
        self._buffer = bytearray()
        self.steps = steps
        self._estimates = {
            label: Estimate(label, start, Basis(basis), None if code is None else PendingCode(code), message, beyond)
            for label, start, basis, code, message, beyond in rows
        }
        self.done = True
        self.wall_s = time.monotonic() - self._started
        return True

    def estimates(self) -> dict[str, Estimate]:
        return dict(self._estimates)

    def close(self) -> None:
        """Stops a child still running (a forecast no longer wanted), and reaps it."""
        if self.pid:
            self._fail()

    def _fail(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self._fd)
        self.pid = 0
        self.failed = self.done = True
        self.wall_s = time.monotonic() - self._started


def _child(
    out: int,
    snapshot: Snapshot,
    model: RuntimeModel,
    declared: Mapping[str, float],
    config: SchedulerConfig,
    limits: Limits,
) -> None:  # pragma: no cover - runs in the child
    code = 1
    try:
        gc.freeze()
        # Background work: where cores are few, the loop and the requests go first.
        with contextlib.suppress(OSError):
            os.nice(NICE)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        if sys.platform == "linux":
            with contextlib.suppress(OSError, AttributeError):
                ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        forecast = Forecast(snapshot, runtimes_for(snapshot, model, declared), config, limits, Memo())
        found = forecast.run()
        rows: list[Row] = [
            (e.workload, e.start, e.basis.value, None if e.code is None else e.code.value, e.message, e.beyond)
            for e in found.values()
        ]
        data = memoryview(pickle.dumps((forecast.steps, rows), protocol=pickle.HIGHEST_PROTOCOL))
        while data:
            data = data[os.write(out, data) :]
        code = 0
    finally:
        os._exit(code)
