"""Who goes next: projects by how far they are from their share, workloads by priority then age."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator

from gpupool.core.decision import PendingCode
from gpupool.core.session import Session
from gpupool.core.state import WorkloadState


def workload_key(ws: WorkloadState) -> tuple[int, float, str]:
    """Within a project: higher priority first, then older first, ties by id."""
    return (-ws.w.priority, ws.w.submit_time, ws.w.id)


def project_key(session: Session, q: int) -> tuple[int, float, str]:
    """Projects below deserved first, then the least served relative to fair share, ties by name."""
    used = sum(session.state.used[q])
    deserved = sum(session.state.tree.queues[q].quota(p).deserved for p in session.state.pools)
    fair = sum(session.fair[q])
    ratio = used / fair if fair else float("inf")
    return (0 if used < deserved else 1, ratio, session.state.tree.queues[q].name)


class FairOrder:
    """Yields waiting workloads one at a time, re-ranking a project after each of its turns.

    The caller tries each workload before asking for the next; a strict-FIFO project whose head
    could not be placed yields nothing more.
    """

    def __init__(
        self,
        session: Session,
        workloads: list[WorkloadState],
        on_block: Callable[[WorkloadState], None] | None = None,
    ) -> None:
        self.session = session
        self.on_block = on_block
        """Told of each workload a strict-FIFO head holds back, as it is held back."""
        self.unchanged = False
        """Set by the caller after trying the workload just yielded when that changed nothing (placed nothing):
        the same project then goes again without being ranked afresh."""
        by_project: dict[int, list[WorkloadState]] = {}
        for ws in workloads:
            by_project.setdefault(ws.queue, []).append(ws)
        self._lists = {q: sorted(lst, key=workload_key, reverse=True) for q, lst in by_project.items()}
        self._heap = [(project_key(session, q), q) for q in sorted(self._lists)]
        heapq.heapify(self._heap)
        self.blocked: dict[int, WorkloadState] = {}
        """Workloads held back by a strict-FIFO head, with that head."""

    def _never(self, ws: WorkloadState) -> bool:
        """A head that can never run (no node could ever host it) does not block a strict-FIFO queue."""
        reason = self.session.pending.get(ws.idx)
        return reason is not None and reason.code is PendingCode.NEVER_FITS

    def __iter__(self) -> Iterator[WorkloadState]:
        while self._heap:
            _, q = heapq.heappop(self._heap)
            lst = self._lists[q]
            while True:
                ws = lst.pop()
                self.unchanged = False
                yield ws
                self._after(q, ws)
                if not lst:
                    break
                if not self.unchanged:
                    heapq.heappush(self._heap, (project_key(self.session, q), q))
                    break
                # Its key is the one it was popped with, below every other (exact: a project's key changes
                # only on its own turns, after which it is pushed afresh), so it goes again.

    def _after(self, q: int, ws: WorkloadState) -> None:
        """A project's turn is over: a strict-FIFO project whose head was not placed yields nothing more."""
        lst = self._lists[q]
        if self.session.state.tree.queues[q].strict_fifo and not ws.bound and not self._never(ws):
            for rest in lst:
                self.blocked[rest.idx] = ws
                if self.on_block is not None:
                    self.on_block(rest)
            lst.clear()
