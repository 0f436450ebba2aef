"""The scheduler loop's thread: when to run the next cycle, whether this server may run one at all (it leads),
and how the loop is doing (for /readyz)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger("gpupool.control")

BACKOFF_MAX_S = 10.0
"""The longest wait between two failing cycles (the store down): one try in this long costs nothing."""


@dataclass(frozen=True, slots=True)
class LoopHealth:
    running: bool
    """The loop's thread is alive (it is not, before start and after stop)."""
    leader: bool
    """This server drives the backends (always, with one replica on SQLite); a standby serves the API only."""
    last_ok_at: float | None
    """time.monotonic() at the end of the last cycle that completed (on a standby: of the last lease check that
    reached the store); None before the first."""
    failing_since: float | None
    """time.monotonic() of the first failure of the current run of failures (cycles; on a standby, lease
    checks); None while they succeed."""


class Lead(Protocol):
    """Leadership as the loop sees it (gpupool.control.leader.Leadership)."""

    def acting(self) -> bool: ...

    def term(self) -> int | None: ...

    def notify(self) -> None: ...

    def step(self) -> None: ...

    def reached(self) -> tuple[float | None, float | None]: ...

    def subscribe(self, callback: Callable[[], None]) -> None: ...

    def start(self, on_wake: Callable[[], None] | None = None) -> None: ...

    def stop(self) -> None: ...


class SchedulerLoop:
    """Runs `cycle` on every wake-up (submit, cancel, process exit) and at least every `interval_s`.

    `cycle` returns whether work is in flight (the loop then looks again soon) and raises when it failed (it has
    logged why). After a failure the loop waits `interval_s`, then twice that, up to BACKOFF_MAX_S; a wake-up
    shortens the wait to `interval_s` (someone reached the store), and the first cycle that succeeds ends it.

    With a `Lead` (replicas on PostgreSQL) cycles run only while this server holds the lease; at the start of
    each term `on_lead` runs first (register nodes, adopt what runs), and a wake-up on a standby is sent on to
    whoever leads."""

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
        self._failures = 0
        self._lead: Lead | None = None
        self._on_lead: Callable[[], None] = lambda: None
        self._term: int | None = None

    def follow(self, lead: Lead, on_lead: Callable[[], None]) -> None:
        """Run cycles only while `lead` says this server leads; `on_lead` at the start of each of its terms."""
        self._lead = lead
        self._on_lead = on_lead
        lead.subscribe(self._wake.set)

    def wake(self) -> None:
        self._wake.set()
        lead = self._lead
        if lead is not None and not lead.acting():
            lead.notify()

    def nudge(self) -> None:
        """A wake-up from this server's own backend (a process ended, a pod changed): it is not sent on to
        another leader, whose backend sees the same change."""
        self._wake.set()

    def lead(self) -> None:
        """Take part in the election without running cycles (start does this first; a test driving cycle()
        by hand calls it alone). Where nobody leads (a first start), take over before the API serves, so it
        never answers with no nodes registered; where another leads, this server is a standby from the start."""
        lead = self._lead
        if lead is None:
            return
        lead.step()
        term = lead.term()
        if term is not None:
            with contextlib.suppress(Exception):  # logged; the loop tries again
                self._take_over(term)
        lead.start(on_wake=self._wake.set)

    def start(self) -> None:
        self.lead()
        self._thread = threading.Thread(target=self._run, name="gpupool-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._lead is not None:
            self._lead.stop()

    def health(self) -> LoopHealth:
        running = self._thread is not None and self._thread.is_alive()
        lead = self._lead
        if lead is not None and not lead.acting():
            reached, failing = lead.reached()
            return LoopHealth(running, False, reached, failing)
        return LoopHealth(running, True, self._last_ok_at, self._failing_since)

    def _run(self) -> None:
        timeout = 0.0
        last_end = 0.0
        while not self._stopping.is_set():
            woken = self._wake.wait(timeout)
            if self._failures:
                # Failing: a wake-up may bring the next try forward, but no closer than interval_s to the last.
                gap = self.interval_s - (time.monotonic() - last_end) if woken else 0.0
            else:
                # Under a burst of submits, cycles back to back would starve the API of the interpreter: rest
                # twice as long as the last cycle took (a third of the time scheduling), so one cycle takes many
                # submits. Short cycles (an idle server's take milliseconds) starve nothing.
                work = self._work_s()
                rest = 2 * work if work > 0.02 else 0.0
                gap = min(rest, self.max_gap_s) - (time.monotonic() - last_end)
            if gap > 0:
                self._stopping.wait(gap)
            self._wake.clear()
            if self._stopping.is_set():
                return
            lead = self._lead
            term = lead.term() if lead is not None else None
            if lead is not None and term is None:
                timeout = self.interval_s  # a standby: the lease's thread wakes it when it leads
                self._term = None
                continue
            try:
                if term != self._term:
                    self._take_over(term)
                busy = self._cycle()
            except Exception:  # the loop must outlive any one bad cycle; the cycle logged it, with its id
                timeout = self._failed()
            else:
                self._succeeded()
                timeout = 0.2 if busy else self.interval_s
            last_end = time.monotonic()

    def _take_over(self, term: int | None) -> None:
        try:
            self._on_lead()
        except Exception:
            if not self._failures:  # once per run of failures, like a failing cycle's
                log.exception("taking over as the leader (epoch %s) failed", term)
            raise
        self._term = term

    def _failed(self) -> float:
        self._failures += 1
        backoff = min(BACKOFF_MAX_S, self.interval_s * 2.0 ** min(self._failures - 1, 16))
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            log.warning("scheduling cycles are failing: trying again every %.0f s at most", BACKOFF_MAX_S)
        return backoff

    def _succeeded(self) -> None:
        if self._failing_since is not None:
            log.info(
                "scheduling cycles succeed again after %.1f s (%d failed)",
                time.monotonic() - self._failing_since,
                self._failures,
            )
        self._last_ok_at = time.monotonic()
        self._failing_since = None
        self._failures = 0
