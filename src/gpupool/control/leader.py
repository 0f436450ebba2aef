"""Leader election through the store: which of several servers on one PostgreSQL drives the scheduler and the
backends, and how a deposed one is kept from acting.

A server holds the lease for a term (its epoch) and renews it every `ttl_s / 5` seconds. It acts (cycles,
launches, stops) only while its own monotonic clock says the last renewal is younger than `ttl_s - margin`:
the database set that renewal's expiry at least `ttl_s` after the renewal was sent, so a server that cannot
renew (paused, partitioned, its store gone) stops acting before any standby may take the lease. On top of
that, every commit of a cycle is fenced: inside the cycle's transaction the lease must still carry this
server's epoch, or nothing of the cycle commits. Standbys try to take the lease every `ttl_s / 10` seconds, so
one takes over at most about `ttl_s * 1.1` seconds after the leader's last renewal."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from gpupool.backends.base import AppEndpoint, Backend, Capabilities, LaunchSpec, Observed, Sample
from gpupool.core import Node
from gpupool.store import leases
from gpupool.store.leases import WakeChannel

log = logging.getLogger("gpupool.leader")

SCHEDULER = "scheduler"
"""The lease's name: one scheduler per store."""
RETRY_MAX_S = 10.0


class Deposed(RuntimeError):
    """This server no longer holds the lease: what it was about to do is left to the new leader."""


class Leadership:
    """The lease as one server holds it (or waits for it), kept by a thread of its own."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        ttl_s: float = 10.0,
        wakes: WakeChannel | None = None,
        name: str = SCHEDULER,
    ) -> None:
        self.sessions = sessions
        """A pool of its own: a renewal must not queue behind API requests for a connection."""
        self.name = name
        self.ttl_s = ttl_s
        self.renew_s = ttl_s / 5
        self.margin_s = ttl_s / 5
        self.holder = f"{socket.gethostname()[:200]}:{os.getpid()}:{secrets.token_hex(4)}"
        self._wakes = wakes
        self._lock = threading.Lock()
        self._epoch: int | None = None
        self._valid_until = 0.0
        self._stopping = threading.Event()
        self._poke = threading.Event()
        self._threads: list[threading.Thread] = []
        self._listeners: list[Callable[[], None]] = []
        self._reached_at: float | None = None
        self._failing_since: float | None = None
        self._stale_logged = False

    # -- what the loop asks --------------------------------------------------------------------------------
    def acting(self) -> bool:
        with self._lock:
            return self._epoch is not None and time.monotonic() < self._valid_until

    def term(self) -> int | None:
        """The epoch while this server may act, else None."""
        with self._lock:
            return self._epoch if self._epoch is not None and time.monotonic() < self._valid_until else None

    def subscribe(self, callback: Callable[[], None]) -> None:
        """`callback` runs (on the lease's thread) whenever this server gains or loses the lease."""
        self._listeners.append(callback)

    def notify(self) -> None:
        """Wake whoever leads (a submit or cancel taken here, by a standby). Never blocks."""
        if self._wakes is not None:
            self._wakes.send()

    def reached(self) -> tuple[float | None, float | None]:
        """When the lease's store was last reached (monotonic), and since when it has not been (or None)."""
        return self._reached_at, self._failing_since

    def fence(self, s: Session) -> None:
        """In a cycle's transaction, before it commits: the lease must still be this server's term."""
        with self._lock:
            epoch = self._epoch
        if epoch is None or not leases.renew(s, self.name, self.holder, epoch, self.ttl_s):
            self._lose(f"the lease is no longer epoch {epoch}'s: this cycle's decisions are not committed")
            raise Deposed(f"not the leader (epoch {epoch} is over)")

    # -- the lease's thread --------------------------------------------------------------------------------
    def step(self) -> None:
        """One try to take or renew the lease, now (a server starting: if nobody leads, it leads before it
        serves, as a lone server always did)."""
        self._step()

    def start(self, on_wake: Callable[[], None] | None = None) -> None:
        """Start keeping the lease; with a wake channel, `on_wake` runs for every wake-up another server sends."""
        self._threads = [threading.Thread(target=self._run, name="gpupool-lease", daemon=True)]
        if self._wakes is not None:
            wakes = self._wakes
            self._threads.append(
                threading.Thread(target=self._retry, args=("sending wake-ups", wakes.sender), daemon=True)
            )
            if on_wake is not None:
                listen = on_wake

                def listener(stop: threading.Event) -> None:
                    wakes.listen(stop, listen)

                self._threads.append(
                    threading.Thread(target=self._retry, args=("listening for wake-ups", listener), daemon=True)
                )
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Stop, and give the lease up so that a standby takes over at once."""
        self._stopping.set()
        self._poke.set()
        for t in self._threads:
            t.join(timeout=5)
        with self._lock:
            epoch, self._epoch = self._epoch, None
        if epoch is not None:
            try:
                with self.sessions() as s:
                    leases.release(s, self.name, self.holder, epoch)
                    s.commit()
                log.info("gave up the lease (epoch %d)", epoch)
            except Exception as e:  # the store is gone: the lease runs out by itself
                log.warning("could not give up the lease (epoch %d): %s", epoch, _short(e))

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._step()
            with self._lock:
                holding = self._epoch is not None
            self._poke.wait(self.renew_s if holding else self.renew_s / 2)
            self._poke.clear()

    def _step(self) -> None:
        sent = time.monotonic()
        with self._lock:
            epoch = self._epoch
        try:
            with self.sessions() as s:
                if epoch is None:
                    got = leases.acquire(s, self.name, self.holder, self.ttl_s)
                    s.commit()
                else:
                    kept = leases.renew(s, self.name, self.holder, epoch, self.ttl_s)
                    s.commit()
        except Exception as e:
            if self._failing_since is None:
                self._failing_since = time.monotonic()
                log.warning("cannot reach the store for the lease: %s (retrying every %.1f s)", _short(e), self.renew_s)
            self._check_stale()
            return
        if self._failing_since is not None:
            log.info("the store answers the lease again after %.1f s", time.monotonic() - self._failing_since)
        self._reached_at, self._failing_since = time.monotonic(), None
        if epoch is None:
            if got is not None:
                with self._lock:
                    self._epoch, self._valid_until = got, sent + self.ttl_s - self.margin_s
                self._stale_logged = False
                log.info("leader now (epoch %d, holder %s)", got, self.holder)
                self._changed()
        elif kept:
            with self._lock:
                self._valid_until = sent + self.ttl_s - self.margin_s
            if self._stale_logged:
                log.info("renewed the lease (epoch %d) again: acting again", epoch)
                self._stale_logged = False
                self._changed()
        else:
            self._lose(f"another server holds the lease now (epoch {epoch} is over)")

    def _check_stale(self) -> None:
        with self._lock:
            stale = self._epoch is not None and time.monotonic() >= self._valid_until
        if stale and not self._stale_logged:
            self._stale_logged = True
            log.warning("could not renew the lease within %.0f s: stopped acting until it is renewed", self.ttl_s)
            self._changed()

    def _lose(self, why: str) -> None:
        with self._lock:
            had, self._epoch, self._valid_until = self._epoch, None, 0.0
        if had is not None:
            log.warning("no longer the leader: %s", why)
            self._changed()

    def _changed(self) -> None:
        for callback in self._listeners:
            callback()

    def _retry(self, what: str, body: Callable[[threading.Event], None]) -> None:
        """Run `body` until stopped, again after each failure with a growing pause; one line per outage."""
        pause = 0.5
        down_since: float | None = None
        while not self._stopping.is_set():
            try:
                body(self._stopping)
                return
            except Exception as e:
                if down_since is None:
                    down_since = time.monotonic()
                    log.warning("%s failed: %s (retrying)", what, _short(e))
            self._stopping.wait(pause)
            pause = min(RETRY_MAX_S, pause * 2)


def _short(e: BaseException) -> str:
    orig = getattr(e, "orig", None)
    return " ".join(str(orig if orig is not None else e).split())[:300] or type(e).__name__


class LeaderBackend:
    """The backend as a leader drives it: launches, stops and forgets only while this server may act, so a
    deposed leader that resumes in the middle of a cycle touches nothing. Reads pass through. On a new term
    `adopt` takes up what runs, where the backend needs telling (the local one: another server on this host
    and data dir may have launched it); the Kubernetes backend's watch sees every pod by itself."""

    def __init__(self, inner: Backend, leadership: Leadership) -> None:
        self.inner = inner
        self.leadership = leadership

    def adopt(self) -> None:
        adopt = getattr(self.inner, "adopt", None)
        if callable(adopt):
            adopt()

    def _guard(self, what: str) -> None:
        if not self.leadership.acting():
            raise Deposed(f"not the leader: {what} is left to the server that leads now")

    def inventory(self) -> list[Node]:
        return self.inner.inventory()

    def capabilities(self) -> Capabilities:
        return self.inner.capabilities()

    def launch(self, spec: LaunchSpec) -> None:
        self._guard(f"launching {spec.alloc_id}")
        self.inner.launch(spec)

    def stop(self, alloc_id: str, force: bool) -> None:
        self._guard(f"stopping {alloc_id}")
        self.inner.stop(alloc_id, force)

    def observe(self) -> dict[str, Observed] | None:
        return self.inner.observe()

    def forget(self, alloc_id: str) -> None:
        self._guard(f"forgetting {alloc_id}")
        self.inner.forget(alloc_id)

    def read_log(self, workload_id: int, rank: int, offset: int, limit: int) -> bytes:
        return self.inner.read_log(workload_id, rank, offset, limit)

    def healthy(self, alloc_id: str, port: int | None) -> bool:
        return self.inner.healthy(alloc_id, port)

    def app_endpoint(self, alloc_id: str, port: int | None) -> AppEndpoint | None:
        return self.inner.app_endpoint(alloc_id, port)

    def sample(self) -> Sample:
        return self.inner.sample()

    def __getattr__(self, name: str) -> Any:
        # What a backend offers beyond the protocol (the local one's app_socket, asked for with getattr).
        return getattr(self.inner, name)
