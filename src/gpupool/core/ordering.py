"""Who goes next: the queue tree walked level by level by share, workloads by priority then age.

At every level of the tree (departments, any deeper levels, projects) the member with waiting work that goes
first is the one below its deserved quota, then the one least served relative to its fair share (used over
fair share, summed over pools), then the one whose head was submitted first, then by the head's id. A
project's head is the workload it would send next; a department's is the head of the member it would send.
So departments take turns by their own share, and projects within a department by theirs (KAI-Scheduler's
hierarchical queue order), and at an equal share the work that has waited longest goes first (as Kueue's
heads do), not the project whose name sorts first.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator

from gpupool.core.decision import PendingCode
from gpupool.core.session import Session
from gpupool.core.state import WorkloadState

ROOT = -1
"""The tree's top, above its root queues."""

Share = tuple[int, float]
"""How a queue stands: 0 below its deserved quota (else 1), then used over fair share."""
Key = tuple[int, float, float, str]
"""A member's rank among its siblings: its `Share`, then its head's submit time and id. Lower goes first."""


def workload_key(ws: WorkloadState) -> tuple[int, float, str]:
    """Within a project: higher priority first, then older first, ties by id."""
    return (-ws.w.priority, ws.w.submit_time, ws.w.id)


class FairOrder:
    """Yields waiting workloads one at a time, re-ranking the queues just served after each turn.

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
        no queue's share moved, so only the served project's head is ranked afresh."""
        by_project: dict[int, list[WorkloadState]] = {}
        for ws in workloads:
            by_project.setdefault(ws.queue, []).append(ws)
        self._lists = {q: sorted(lst, key=workload_key, reverse=True) for q, lst in by_project.items()}
        chain = session.state.tree.chain
        self._parent: dict[int, int] = {}
        for q in self._lists:
            for child, parent in zip(chain[q], (*chain[q][1:], ROOT), strict=True):
                self._parent[child] = parent
        queues, pools = session.state.tree.queues, session.state.pools
        self._quota = {q: (sum(queues[q].quota(p).deserved for p in pools), sum(session.fair[q])) for q in self._parent}
        """Queue -> its deserved quota and fair share, summed over pools (fixed for the cycle)."""
        self._heaps: dict[int, list[tuple[Key, int]]] = {ROOT: []}
        """Department (or ROOT) -> its members with waiting work, each with its key, less those being served."""
        for q in sorted(self._parent, key=lambda q: -len(chain[q])):  # deepest first: members before parents
            if q not in self._lists:
                heapq.heapify(self._heaps[q])
            self._heaps.setdefault(self._parent[q], []).append((self._key(q), q))
        heapq.heapify(self._heaps[ROOT])
        self.blocked: dict[int, WorkloadState] = {}
        """Workloads held back by a strict-FIFO head, with that head."""

    def _share(self, q: int) -> Share:
        """Below deserved first, then the least served relative to fair share."""
        used = sum(self.session.state.used[q])
        deserved, fair = self._quota[q]
        return (0 if used < deserved else 1, used / fair if fair else float("inf"))

    def _key(self, q: int) -> Key:
        lst = self._lists.get(q)
        if lst is not None:
            head = lst[-1].w
            return (*self._share(q), head.submit_time, head.id)
        top = self._heaps[q][0][0]
        return (*self._share(q), top[2], top[3])

    def _never(self, ws: WorkloadState) -> bool:
        """A head that can never run (no node could ever host it) does not block a strict-FIFO queue."""
        reason = self.session.pending.get(ws.idx)
        return reason is not None and reason.code is PendingCode.NEVER_FITS

    def __iter__(self) -> Iterator[WorkloadState]:
        path = self._descend()
        while path:
            q = path[-1][1]
            lst = self._lists[q]
            ws = lst.pop()
            self.unchanged = False
            yield ws
            self._after(q, ws)
            if lst and self.unchanged and self._still_first(path, lst[-1]):
                continue
            self._return(path)
            path = self._descend()

    def _descend(self) -> list[tuple[Key, int]]:
        """Take the first member at each level, from the top down to a project: the path to be served."""
        path: list[tuple[Key, int]] = []
        heap = self._heaps[ROOT]
        while heap:
            entry = heapq.heappop(heap)
            path.append(entry)
            heap = self._heaps.get(entry[1], [])
        return path

    def _still_first(self, path: list[tuple[Key, int]], head: WorkloadState) -> bool:
        """After a turn that changed nothing, whether the path still goes first at every level with the project's
        new head: no share moved, and no other queue's key changed (a key changes only on its own turns)."""
        for key, q in reversed(path):
            rivals = self._heaps[self._parent[q]]
            if rivals and (key[0], key[1], head.w.submit_time, head.w.id) > rivals[0][0]:
                return False
        return True

    def _return(self, path: list[tuple[Key, int]]) -> None:
        """Put the served path back, bottom up, each queue with waiting work left ranked afresh."""
        for _, q in reversed(path):
            if self._lists.get(q) or self._heaps.get(q):
                heapq.heappush(self._heaps[self._parent[q]], (self._key(q), q))

    def _after(self, q: int, ws: WorkloadState) -> None:
        """A project's turn is over: a strict-FIFO project whose head was not placed yields nothing more."""
        lst = self._lists[q]
        if self.session.state.tree.queues[q].strict_fifo and not ws.bound and not self._never(ws):
            for rest in lst:
                self.blocked[rest.idx] = ws
                if self.on_block is not None:
                    self.on_block(rest)
            lst.clear()
