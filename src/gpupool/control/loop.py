"""The scheduler loop's thread: when to run the next cycle, and how the loop is doing (for /readyz)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoopHealth:
    running: bool
    """The loop's thread is alive (it is not, before start and after stop)."""
    leader: bool
    """This server drives the backends (always, with one replica)."""
    last_ok_at: float | None
    """time.monotonic() at the end of the last cycle that completed; None before the first."""
    failing_since: float | None
    """time.monotonic() of the first failed cycle of the current run of failures; None while cycles succeed."""


class SchedulerLoop:
    """Runs `cycle` on every wake-up (submit, cancel, process exit) and at least every `interval_s`.

    `cycle` returns whether work is in flight (the loop then looks again soon) and raises when it failed (it has
    logged why)."""

    def __init__(
        self,
        cycle: Callable[[], bool],
        work_s: Callable[[], float],
        *,
        interval_s: float = 2.0,
        max_gap_s: float = 0.5,
    ) -> None:
        self._cycle = cycle
        self._work_s = work_s
        self.interval_s = interval_s
        self.max_gap_s = max_gap_s
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_ok_at: float | None = None
        self._failing_since: float | None = None

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpupool-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def health(self) -> LoopHealth:
        running = self._thread is not None and self._thread.is_alive()
        return LoopHealth(running, True, self._last_ok_at, self._failing_since)

    def _run(self) -> None:
        timeout = 0.0
        last_end = 0.0
        while not self._stopping.is_set():
            self._wake.wait(timeout)
            # Under a burst of submits, cycles back to back would starve the API of the interpreter: rest twice
            # as long as the last cycle took (a third of the time scheduling), so one cycle takes many submits.
            # Short cycles (an idle server's take milliseconds) starve nothing, so work still starts at once.
            work = self._work_s()
            rest = 2 * work if work > 0.02 else 0.0
            gap = min(rest, self.max_gap_s) - (time.monotonic() - last_end)
            if gap > 0:
                self._stopping.wait(gap)
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                busy = self._cycle()
            except Exception:  # the loop must outlive any one bad cycle; the cycle logged it, with its id
                busy = False
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
            else:
                self._last_ok_at = time.monotonic()
                self._failing_since = None
            last_end = time.monotonic()
            timeout = 0.2 if busy else self.interval_s
