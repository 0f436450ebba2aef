"""A member's log, followed as it is written: streamed from the backend where it can stream (kubernetes), read
on from the last offset where it is a file (local), until the workload has ended (or a policy holds it) and
its log is drained, or the caller may no longer read it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import anyio
from anyio import CapacityLimiter
from sqlalchemy.orm import Session, sessionmaker

from gpupool.backends.base import Backend
from gpupool.lifecycle.phases import TERMINAL
from gpupool.store.tables import WorkloadRow

CHUNK = 64 * 1024
_STREAMS = CapacityLimiter(32)
"""Threads that wait on a backend's log stream: their own pool, so quiet logs never hold the API's workers."""


@dataclass(frozen=True, slots=True)
class _Status:
    over: bool
    """Ended, gone, or held by a policy until someone resumes it: no more output will come by itself."""
    attempt: int


def _status(sessions: sessionmaker[Session], workload_id: int) -> _Status:
    with sessions() as s:
        row = s.get(WorkloadRow, workload_id)
        if row is None:
            return _Status(True, 0)
        return _Status(row.state in TERMINAL or row.hold, row.attempt)


async def follow(
    sessions: sessionmaker[Session],
    backend: Backend,
    workload_id: int,
    rank: int,
    offset: int,
    *,
    allowed: Callable[[], bool],
    recheck_s: float,
    poll_s: float = 0.5,
) -> AsyncIterator[bytes]:
    """`allowed` is asked again every `recheck_s`: a caller whose rights went (a revoked token, a membership
    ended) stops receiving. A streaming backend's offsets are those of the current attempt's log (each attempt
    is a new pod); a requeued workload's next attempt is followed from its start."""
    stream: Callable[[int, int, int], Iterator[bytes]] | None = getattr(backend, "follow_log", None)
    checked = time.monotonic()
    status = await anyio.to_thread.run_sync(_status, sessions, workload_id)
    while True:
        if stream is not None:
            members = stream(workload_id, rank, offset)
            while (
                data := await anyio.to_thread.run_sync(next, members, b"", abandon_on_cancel=True, limiter=_STREAMS)
            ) != b"":
                offset += len(data)
                yield data
        data = await anyio.to_thread.run_sync(backend.read_log, workload_id, rank, offset, CHUNK)
        if data:
            offset += len(data)
            yield data
            continue
        if status.over:
            return  # it was over before the last read, which found nothing more
        if time.monotonic() - checked >= recheck_s:
            if not await anyio.to_thread.run_sync(allowed):
                return
            checked = time.monotonic()
        await anyio.sleep(poll_s)
        now = await anyio.to_thread.run_sync(_status, sessions, workload_id)
        if stream is not None and now.attempt != status.attempt:
            offset = 0
        status = now
