"""A member's log, followed as it is written: streamed from the backend where it can stream (kubernetes), read
on from the last offset where it is a file (local), until the workload has ended and its log is drained."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from sqlalchemy.orm import Session, sessionmaker

from gpupool.backends.base import Backend
from gpupool.lifecycle.phases import TERMINAL
from gpupool.store.tables import WorkloadRow

CHUNK = 64 * 1024


def follow(
    sessions: sessionmaker[Session],
    backend: Backend,
    workload_id: int,
    rank: int,
    offset: int,
    *,
    poll_s: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[bytes]:
    stream: Callable[[int, int, int], Iterator[bytes]] | None = getattr(backend, "follow_log", None)
    while True:
        if stream is not None:
            for data in stream(workload_id, rank, offset):
                offset += len(data)
                yield data
        data = backend.read_log(workload_id, rank, offset, CHUNK)
        if data:
            offset += len(data)
            yield data
            continue
        with sessions() as s:
            row = s.get(WorkloadRow, workload_id)
            ended = row is None or row.state in TERMINAL
        if ended:
            # It ended after the last read: what it wrote in between is still to come.
            while data := backend.read_log(workload_id, rank, offset, CHUNK):
                offset += len(data)
                yield data
            return
        sleep(poll_s)  # nothing new yet: a file (or a pod not started) is looked at again shortly
