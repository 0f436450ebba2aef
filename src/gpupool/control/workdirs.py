"""Finished workloads' working directories, removed once past their retention."""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.backends.base import Backend
from gpupool.lifecycle.phases import TERMINAL
from gpupool.store.tables import WorkloadRow

log = logging.getLogger("gpupool.control")


def collect_workdirs(s: Session, backend: Backend, ended_before: float) -> list[int]:
    """Remove the working directories of workloads that ended before `ended_before` (or were deleted)."""
    storage = backend.capabilities().storage
    if storage is None:
        return []
    have = storage.workdir_ids()
    done: list[int] = []
    ended = [p.value for p in TERMINAL]
    for i in range(0, len(have), 500):
        query = select(WorkloadRow.id).where(
            WorkloadRow.id.in_(have[i : i + 500]), WorkloadRow.state.in_(ended), WorkloadRow.finished_at < ended_before
        )
        for wid in s.scalars(query):
            storage.collect_workdir(wid)
            done.append(wid)
    if done:
        log.info("removed the working directories of %d finished workloads past their retention", len(done))
    return done
