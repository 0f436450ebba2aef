"""The store as the API sees it: a watch that probes it with a deadline, and the 503 every request that needs it
gets while it is down, at once and with Retry-After, instead of a traceback or a request that hangs.

An outage leaves two lines in the log, a warning when it starts and an info when it ends, however many requests
it refused. The watch is what decides: a request that fails on the store only asks it to look now. A PostgreSQL
server that hangs (stopped with SIGSTOP, or its host frozen) still has its kernel acknowledge every packet, so
neither TCP keepalives nor its own statement timeout end a query: only a deadline kept here does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sqlite3
import threading
import time
from pathlib import Path

from fastapi import Request
from fastapi.responses import JSONResponse
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, OperationalError, PendingRollbackError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpupool.store.engine import sqlite_fault

log = logging.getLogger("gpupool.store")

RETRY_AFTER_S = 1
PROBE_INTERVAL_S = 0.25
PROBE_DEADLINE_S = 1.0
"""A probe unanswered for this long declares the store down; with the interval, a hang is seen within 1.25 s."""
MIN_FREE_BYTES = 1 << 20
"""After a fault, SQLite counts as back only with this much free on its disk: a write that fits in the WAL's
old frames can pass while a checkpoint, which grows the database file, still cannot."""
SQLITE_BUSY = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
"""Another writer held the file past the busy timeout: worth a retry."""
_GAP_S = 0.1
"""The least time between two probes, however many failing requests ask for one."""
_UNGUARDED = ("/healthz", "/readyz", "/docs", "/openapi.json", "/portal/")
"""Paths that never touch the store: answered whatever its state."""


def unavailable() -> JSONResponse:
    return JSONResponse(
        {"detail": "the store is unavailable; retry later"},
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def store_fault(exc: BaseException) -> bool:
    """Whether an error says the store cannot be reached or used, rather than that a statement was wrong (SQLite
    says "no such column" with the same OperationalError as "disk I/O error": its result code tells them apart)."""
    if isinstance(exc, PoolTimeout | PendingRollbackError):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    if isinstance(exc.orig, sqlite3.Error):
        return sqlite_fault(exc.orig) or (getattr(exc.orig, "sqlite_errorcode", None) or 0) & 0xFF in SQLITE_BUSY
    return isinstance(exc, OperationalError)


def _describe(exc: BaseException) -> str:
    """One line for the log: the driver's own words (host and reason, never a password)."""
    inner = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    words = " ".join(str(inner).split())[:300]
    return f"{type(inner).__name__}: {words}" if words else type(inner).__name__


class StoreWatch:
    """Probes the store every `interval_s` on a thread of its own, each probe on a fresh thread so that one that
    hangs is abandoned after `deadline_s` and the store declared down meanwhile. SQLite answers a read even on a
    full or read-only disk: its probe also checks that the file may be written, and once a request has met a
    fault, writes (the header's user_version, set to what it is) and checks the free space."""

    def __init__(
        self, engine: Engine, *, interval_s: float = PROBE_INTERVAL_S, deadline_s: float = PROBE_DEADLINE_S
    ) -> None:
        self.engine = engine
        self.interval_s = interval_s
        self.deadline_s = deadline_s
        self._sqlite = engine.dialect.name == "sqlite"
        database = engine.url.database if self._sqlite else None
        self._file = Path(database) if database and database != ":memory:" else None
        self._down_since: float | None = None
        self._probe_since: float | None = None
        self._suspect: str | None = None
        self._refused = 0
        self._odd_at = 0.0
        self._odd_count = 0
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def down(self) -> bool:
        """The store is down, or a probe has waited past its deadline (the watch says so on its next tick)."""
        since = self._probe_since
        return self._down_since is not None or (since is not None and time.monotonic() - since > self.deadline_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpupool-store-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.deadline_s + 1)

    def suspect(self, exc: BaseException) -> None:
        """A request failed on the store: probe now rather than at the next tick."""
        self._refused += 1
        if self._suspect is None:
            self._suspect = _describe(exc)
        self._wake.set()

    def refused(self) -> None:
        self._refused += 1

    def _run(self) -> None:
        while not self._stopping.is_set():
            suspect, self._suspect = self._suspect, None
            error = self._probe(write=self._sqlite and (suspect is not None or self._down_since is not None))
            if error is None:
                self._up(suspect)
            else:
                self._down(error)
            self._stopping.wait(_GAP_S)
            self._wake.wait(self.interval_s - _GAP_S)
            self._wake.clear()

    def _probe(self, write: bool) -> str | None:
        """None if the store answered; else why not."""
        result: list[str | None] = []

        def attempt() -> None:
            # Timed from here, not from when the thread was asked for: a starved interpreter is not the store.
            self._probe_since = time.monotonic()
            try:
                result.append(self._attempt(write))
            except Exception as e:  # what the store said is the outage's reason
                result.append(_describe(e))

        probe = threading.Thread(target=attempt, name="gpupool-store-probe", daemon=True)
        probe.start()
        probe.join(self.deadline_s)
        while probe.is_alive() and not self.down:
            probe.join(0.05)  # started late: its deadline runs from its start
        if probe.is_alive():
            self._down(f"no answer within {self.deadline_s:g} s")
            while probe.is_alive() and not self._stopping.is_set():
                probe.join(self.interval_s)  # one probe at a time: a hung store does not pile up threads
        self._probe_since = None
        return result[0] if result else "no answer"

    def _attempt(self, write: bool) -> str | None:
        # A connection opened on a file it may not write is read-only for life, and its reads pass: look first.
        if self._file is not None and not os.access(self._file, os.W_OK):
            return f"{self._file} may not be written"
        with self.engine.connect() as conn:
            if not write:
                conn.exec_driver_sql("SELECT 1")
                return None
            version = int(conn.exec_driver_sql("PRAGMA user_version").scalar() or 0)
            conn.exec_driver_sql(f"PRAGMA user_version = {version}")
            conn.commit()
        free = shutil.disk_usage((self._file or Path(".")).parent).free
        return None if free >= MIN_FREE_BYTES else f"{free} bytes free on the database's disk"

    def _down(self, reason: str) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            self._refused = 0
            log.warning("the store is unavailable (%s); requests get 503 until it answers again", reason)

    def _up(self, suspect: str | None) -> None:
        if self._down_since is not None:
            lasted = time.monotonic() - self._down_since
            self._down_since = None
            # Connections opened during the outage may be read-only ones (SQLite) or dead: start afresh.
            self.engine.dispose()
            log.info("the store answers again after %.1f s; %d requests got 503 meanwhile", lasted, self._refused)
        elif suspect is not None:
            # A request failed though the store answers: say so, at most once a minute.
            self._odd_count += 1
            now = time.monotonic()
            if now - self._odd_at >= 60:
                log.warning("%d request(s) failed on the store, which answers: %s", self._odd_count, suspect)
                self._odd_at, self._odd_count = now, 0


async def store_error(request: Request, exc: Exception) -> JSONResponse:
    """Exception handler: a request that failed on the store gets 503 and Retry-After, never a traceback; the
    watch looks at once, and logs the outage if there is one. Other database errors stay 500s."""
    if not store_fault(exc):
        raise exc
    watch: StoreWatch | None = getattr(request.app.state, "store_watch", None)
    if watch is not None:
        watch.suspect(exc)
    return unavailable()


class StoreGuard:
    """While the store is down, a request that needs it gets 503 at once, without taking a thread or a
    connection. A request already waiting on the store when it goes down gets its 503 as soon as the watch
    sees that (its thread stays blocked, and is let go when the store answers or its connection dies)."""

    def __init__(self, app: ASGIApp, watch: StoreWatch) -> None:
        self.app = app
        self.watch = watch

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not self.watch.running or path == "/" or path.startswith(_UNGUARDED):
            await self.app(scope, receive, send)
            return
        if self.watch.down:
            self.watch.refused()
            await unavailable()(scope, receive, send)
            return
        started = abandoned = False

        async def guarded(message: Message) -> None:
            nonlocal started
            if abandoned:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        task = asyncio.ensure_future(self.app(scope, receive, guarded))
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=_GAP_S)
                if not task.done() and not started and self.watch.down:
                    abandoned = True
                    task.add_done_callback(_forget)
                    self.watch.refused()
                    await unavailable()(scope, receive, send)
                    return
        except asyncio.CancelledError:
            task.cancel()
            raise
        task.result()


def _forget(task: asyncio.Future[None]) -> None:
    """An abandoned request ends when the store lets it go; its answer has been given, and its error was
    logged, if any, by the handlers within."""
    if not task.cancelled():
        task.exception()
