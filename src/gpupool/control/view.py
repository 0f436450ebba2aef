"""What the scheduler keeps of the workloads between cycles, so a cycle reads only what was written since the last.

Queued workloads (there may be 100,000) are kept as the core's Workloads, built once from their columns; live ones
(a few thousand at most: they hold devices) as rows of the controller's session, because reconciling, policies,
telemetry and launches change them. Each cycle reads the rows stamped since its last look (gpupool.store.changes)
and replaces what it keeps of them. Rows the cycle itself writes come back to it by `settle` after its commit; a
queued workload's reason and nominated nodes, which only the scheduler reads, it writes without a stamp and keeps
as it wrote them (`waiting`)."""

from __future__ import annotations

import gc
import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Row
from sqlalchemy.orm import Session

from gpupool.core import Decision, Workload
from gpupool.lifecycle.events import EventCode
from gpupool.lifecycle.phases import LIVE, QUEUED, PendingReason
from gpupool.lifecycle.transitions import waiting_args
from gpupool.store import changes
from gpupool.store.snapshot import core_workload, row_id
from gpupool.store.tables import WorkloadRow


@dataclass(slots=True)
class Queued:
    """A queued workload as the scheduler last read or wrote it."""

    version: int
    code: str | None
    """Its current reason as the scheduler last gave it: the PendingReason and the sentence's detail; None where
    its reason is not the scheduler's (just submitted, requeued after a stop)."""
    detail: str | None
    args: Args
    """The numbers behind it, as the core gives them (`Pending.args`)."""
    nominated: list[str]
    workload: Workload


Args = tuple[tuple[str, int | str], ...]


def _queued(row: WorkloadRow | Row[Any], project: str, intern: dict[Args, Args]) -> Queued:
    stored = row.reason_args or {}
    ours = row.reason_event == EventCode.QUEUED and "detail" in stored
    code, detail = (row.reason_code, stored["detail"]) if ours else (None, None)
    args = tuple((k, v) for k, v in stored.items() if k != "detail") if ours else ()
    # One object for equal arguments, so the steady cycle compares them by identity (see `waiting`).
    return Queued(
        int(row.version), code, detail, intern.setdefault(args, args), list(row.nominated), core_workload(row, project)
    )


class WorkloadView:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget everything: the next refresh reads every row (at start, and after a cycle failed)."""
        self.since: int | None = None
        self.queued: dict[int, Queued] = {}
        self._by_core: dict[str, Queued] = {}
        """The same, by the core's id for them."""
        self.live: dict[int, WorkloadRow] = {}
        self._projects: dict[int, str] = {}
        self._order: list[Workload] | None = None
        self._args: dict[Args, Args] = {}
        """Reasons' arguments as kept, one object for equal ones."""

    def refresh(self, session: Session, projects: Mapping[int, str]) -> None:
        """Read what was written since the last refresh (everything, the first time)."""
        if any(projects.get(pid) != name for pid, name in self._projects.items()):
            self.reset()  # a project renamed or gone: the kept workloads name it
        self._projects = dict(projects)
        mark = changes.mark(session)
        reload: list[int] = []
        for t in changes.scheduled_rows(session, self.since):
            if t.state in QUEUED and not t.hold:
                kept = self.queued.get(t.id)
                if kept is None or kept.version != t.version:  # the same version: this scheduler's own write
                    self._drop(t.id)
                    self._keep(t.id, _queued(t, projects[t.project_id], self._args))
            elif t.state in LIVE:
                row = self.live.get(t.id)
                if row is None or row.version != t.version:
                    reload.append(t.id)
            else:
                self._drop(t.id)
        self.settle(changes.load_rows(session, reload))
        if self.since is None:
            # What a full read keeps lives long and holds no reference cycles: keep the collector from walking it
            # in every full collection (it made a third of a cycle at 100,000 queued). Refcounting still frees it.
            gc.freeze()
        self.since = mark

    def rows(self) -> list[WorkloadRow]:
        """The live rows, by id."""
        return [self.live[k] for k in sorted(self.live)]

    def workloads(self, rows: Sequence[WorkloadRow]) -> list[Workload]:
        """The core's workloads, by id: these rows' (live, or queued again this cycle) and the queued ones kept."""
        if self._order is None:
            self._order = [self.queued[k].workload for k in sorted(self.queued)]
        mine = [core_workload(r, self._projects[r.project_id]) for r in rows if r.id not in self.queued]
        return list(heapq.merge(mine, self._order, key=lambda w: w.id))

    def bound(self, session: Session, decision: Decision, rows: dict[int, WorkloadRow]) -> None:
        """Adds to `rows` the queued rows the decision binds, read now, where they are as the decision saw them
        (a row written since, cancelled say, is left out: its bind is not made, and it is read again)."""
        wanted = {row_id(b.workload) for b in decision.binds} - rows.keys()
        for row in changes.load_rows(session, wanted):
            seen = self.queued.get(row.id)
            if seen is not None and row.version == seen.version and row.state in QUEUED and not row.hold:
                rows[row.id] = row

    def waiting(self, decision: Decision, rows: Mapping[int, WorkloadRow]) -> list[dict[str, Any]]:
        """The reasons and nominations of kept queued workloads that changed, as gpupool.store.changes.note_waiting
        takes them; kept as written. Rows of this cycle (`rows`) are the caller's to write."""
        notes: list[dict[str, Any]] = []
        queued = EventCode.QUEUED.value
        same: dict[tuple[int, int], tuple[Args, Args, bool]] = {}
        """(id of kept arguments, id of the decision's) -> both (held: their ids stay theirs) and whether equal.
        A class's workloads share both, so 100,000 comparisons are a few hundred."""
        if len(self._args) > 4 * len(self.queued) + 1024:
            self._args = {args: args for args in (q.args for q in self.queued.values())}
        for pend in decision.pending:
            kept = self._by_core.get(pend.workload)
            # The steady case, 100,000 times a cycle: the same reason as last time, compared without building one.
            if kept is None:
                continue
            if kept.code == pend.code.value and kept.detail == pend.message and not (pend.nominated or kept.nominated):
                pair = same.get((id(kept.args), id(pend.args)))
                if pair is None or pair[0] is not kept.args or pair[1] is not pend.args:
                    pair = same[(id(kept.args), id(pend.args))] = (kept.args, pend.args, kept.args == pend.args)
                if pair[2]:
                    continue
            wid = row_id(pend.workload)
            if wid in rows:
                continue
            nominated = sorted({x.node for x in pend.nominated})
            if nominated != kept.nominated:
                kept.workload = replace(kept.workload, nominated_nodes=tuple(nominated))
                self._order = None
            # As lifecycle.waiting records it on a row: the scheduler's code (a PendingReason), its sentence and
            # its arguments.
            code = PendingReason(pend.code.value).value
            args = self._args.setdefault(pend.args, pend.args)
            if kept.code == code and kept.detail == pend.message and kept.args == args and nominated == kept.nominated:
                continue
            kept.code, kept.detail, kept.args, kept.nominated = code, pend.message, args, nominated
            notes.append({
                "wid": wid, "seen": kept.version, "reason_event": queued, "reason_code": code,
                "reason_args": waiting_args(pend.message, args), "nominated": nominated,
            })  # fmt: skip
        return notes

    def settle(self, rows: Iterable[WorkloadRow]) -> None:
        """Keep rows as they are now (read, or written and committed by this cycle)."""
        for row in rows:
            self._drop(row.id)
            if row.state in LIVE:
                self.live[row.id] = row
            elif row.state in QUEUED and not row.hold:
                self._keep(row.id, _queued(row, self._projects[row.project_id], self._args))

    def forget(self, ids: Iterable[int]) -> None:
        """Rows someone else wrote while this cycle changed them: read them again next time."""
        for wid in ids:
            self._drop(wid)

    def _keep(self, wid: int, queued: Queued) -> None:
        self.queued[wid] = queued
        self._by_core[queued.workload.id] = queued
        self._order = None

    def _drop(self, wid: int) -> None:
        self.live.pop(wid, None)
        gone = self.queued.pop(wid, None)
        if gone is not None:
            del self._by_core[gone.workload.id]
            self._order = None
