"""Apply a decision to a snapshot the way a perfect cluster would, for tests and the simulator.

Binds start at `now`; pipelined workloads keep waiting, remembering the nodes they were nominated to;
evictions release at once (as if the grace period had passed) and the evicted workload is requeued as
pending, keeping its submit time (and its nomination, when it was moved to make room).
"""

from __future__ import annotations

import dataclasses

from gpupool.core.decision import Decision
from gpupool.core.model import Snapshot, State, Workload


def apply_decision(snapshot: Snapshot, decision: Decision, now: float | None = None) -> Snapshot:
    at = snapshot.now if now is None else now
    binds = {b.workload: b for b in decision.binds}
    evicted = {e.workload for e in decision.evictions}
    nominated = {p.workload: tuple(sorted({x.node for x in p.nominated})) for p in decision.pending}
    out: list[Workload] = []
    for w in snapshot.workloads:
        if w.id in evicted:  # a workload moved to make room is nominated for its new place in the same decision
            w = dataclasses.replace(
                w, state=State.PENDING, placements=(), start_time=None, nominated_nodes=nominated.get(w.id, ())
            )
        elif w.id in binds:
            w = dataclasses.replace(
                w, state=State.RUNNING, placements=binds[w.id].placements, start_time=at, nominated_nodes=()
            )
        elif w.state is State.PENDING and w.nominated_nodes != nominated.get(w.id, ()):
            w = dataclasses.replace(w, nominated_nodes=nominated.get(w.id, ()))
        out.append(w)
    return dataclasses.replace(snapshot, workloads=tuple(out), now=at)


def finish_releasing(snapshot: Snapshot) -> Snapshot:
    """Requeue workloads the snapshot shows releasing (their processes have now exited)."""
    out = tuple(
        dataclasses.replace(w, state=State.PENDING, placements=(), start_time=None) if w.state is State.RELEASING else w
        for w in snapshot.workloads
    )
    return dataclasses.replace(snapshot, workloads=out)
