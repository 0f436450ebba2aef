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
Entry = tuple[Key, int]
"""A queue with its key."""


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
        self._heaps: dict[int, list[Entry]] = {ROOT: []}
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
        path = self._descend(ROOT)
        while path:
            q = path[-1][1]
            lst = self._lists[q]
            rivals = self._heaps[self._parent[q]]
            bound, lowest = self._bound(path)
            while True:
                ws = lst.pop()
                self.unchanged = False
                yield ws
                self._after(q, ws)
                if not (lst and self.unchanged):
                    path = self._rerank(path, not self.unchanged)
                    break
                head = lst[-1].w
                if bound is None or (head.submit_time, head.id) < bound:
                    continue
                if not lowest:
                    path = self._rerank(path, False)
                    break
                # Only the project's own level ties: the tied rival takes its place, the levels above still go
                # first whatever their heads (their keys' heads may lag; `_rerank` reads only their shares).
                key = path[-1][0]
                winner = heapq.heapreplace(rivals, ((key[0], key[1], head.submit_time, head.id), q))
                path[-1] = winner
                q = winner[1]
                if q not in self._lists:  # a department beside the projects: down to its first project
                    path.extend(self._descend(q))
                    break
                lst = self._lists[q]
                top = rivals[0][0]
                bound = (top[2], top[3]) if top[0] == key[0] and top[1] == key[1] else None

    def _descend(self, q: int) -> list[Entry]:
        """Take the first member at each level below `q`, down to a project: the path to be served."""
        path: list[Entry] = []
        heap = self._heaps.get(q, [])
        while heap:
            entry = heapq.heappop(heap)
            path.append(entry)
            heap = self._heaps.get(entry[1], [])
        return path

    def _bound(self, path: list[Entry]) -> tuple[tuple[float, str] | None, bool]:
        """While turns change nothing (no share moves, and no other queue is served, so the rivals stay as they
        are), the path goes on being served as long as its project's head ranks before the bound: the earliest
        head of a rival whose share equals the path's at its level (None: no rival ties, so any head does).
        Also whether the project's own level is the only one that ties."""
        bound: tuple[float, str] | None = None
        tied = 0
        last = False
        for key, q in path:
            rivals = self._heaps[self._parent[q]]
            last = bool(rivals) and rivals[0][0][:2] == key[:2]
            if last:
                tied += 1
                head = rivals[0][0][2:]
                if bound is None or head < bound:
                    bound = head
        return bound, last and tied == 1

    def _rerank(self, path: list[Entry], moved: bool) -> list[Entry]:
        """The next path after a turn on `path`: bottom up, each queue on it ranked afresh (its share only if
        `moved`, its head always) against the first of its siblings, the winner held out of its parent's heap
        (one push-pop a level while the same queues win); where a sibling wins, what was held out below the
        loser goes back, and the winner's first members are taken."""
        below: list[Entry] = []
        """The path below the level at hand, top down, held out of their parents' heaps."""
        exhausted = not self._lists[path[-1][1]]
        for key, q in reversed(path):
            if exhausted and q in self._heaps:  # a department whose member on the path ran out: its next one
                below = self._descend(q)
                exhausted = not below
            if exhausted:
                continue
            if below:
                head: tuple[float, str] = (below[0][0][2], below[0][0][3])
            else:
                w = self._lists[q][-1].w
                head = (w.submit_time, w.id)
            share = self._share(q) if moved else (key[0], key[1])
            entry: Entry = ((share[0], share[1], head[0], head[1]), q)
            winner = heapq.heappushpop(self._heaps[self._parent[q]], entry)
            if winner is entry:
                below.insert(0, entry)
                continue
            for parent, held in zip((q, *(e[1] for e in below)), below, strict=False):
                heapq.heappush(self._heaps[parent], held)
            below = [winner, *self._descend(winner[1])]
        if exhausted:
            return self._descend(ROOT)
        return below

    def _after(self, q: int, ws: WorkloadState) -> None:
        """A project's turn is over: a strict-FIFO project whose head was not placed yields nothing more."""
        lst = self._lists[q]
        if self.session.state.tree.queues[q].strict_fifo and not ws.bound and not self._never(ws):
            for rest in lst:
                self.blocked[rest.idx] = ws
                if self.on_block is not None:
                    self.on_block(rest)
            lst.clear()
