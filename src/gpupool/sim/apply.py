"""Apply a decision to a snapshot the way a perfect cluster would: the one applier of the simulations (packing,
organisation), the core's property and scenario tests, and the scale benchmark.

Binds start at `now`; pipelined workloads keep waiting, remembering the nodes they were nominated to;
evictions release at once (as if the grace period had passed) and the evicted workload is requeued as
pending, keeping its submit time (and its nomination, when it was moved to make room).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpupool.core.decision import Decision
from gpupool.core.model import Snapshot, State, Workload


@dataclass(frozen=True, slots=True)
class Applied:
    """A decision carried out: the cluster after it, and what it changed, for simulators that keep books."""

    snapshot: Snapshot
    started: tuple[Workload, ...]
    """The bound workloads as they now run, in the decision's order."""
    evicted: tuple[Workload, ...]
    """The evicted workloads as they ran before it (placements, start time), in the decision's order."""


def apply(snapshot: Snapshot, decision: Decision, now: float | None = None) -> Applied:
    at = snapshot.now if now is None else now
    binds = {b.workload: b for b in decision.binds}
    evicted = {e.workload for e in decision.evictions}
    nominated = {p.workload: tuple(sorted({x.node for x in p.nominated})) for p in decision.pending}
    out: list[Workload] = []
    started: dict[str, Workload] = {}
    stopped: dict[str, Workload] = {}
    for w in snapshot.workloads:
        if w.id in evicted:  # a workload moved to make room is nominated for its new place in the same decision
            stopped[w.id] = w
            w = dataclasses.replace(
                w, state=State.PENDING, placements=(), start_time=None, nominated_nodes=nominated.get(w.id, ())
            )
        elif w.id in binds:
            w = dataclasses.replace(
                w, state=State.RUNNING, placements=binds[w.id].placements, start_time=at, nominated_nodes=()
            )
            started[w.id] = w
        elif w.state is State.PENDING and w.nominated_nodes != nominated.get(w.id, ()):
            w = dataclasses.replace(w, nominated_nodes=nominated.get(w.id, ()))
        out.append(w)
    return Applied(
        dataclasses.replace(snapshot, workloads=tuple(out), now=at),
        tuple(started[wid] for wid in dict.fromkeys(b.workload for b in decision.binds) if wid in started),
        tuple(stopped[wid] for wid in dict.fromkeys(e.workload for e in decision.evictions) if wid in stopped),
    )


def apply_decision(snapshot: Snapshot, decision: Decision, now: float | None = None) -> Snapshot:
    """The snapshot after the decision (`apply`, for callers that only need the cluster)."""
    return apply(snapshot, decision, now).snapshot
