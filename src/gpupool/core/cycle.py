"""schedule(snapshot, config) -> Decision: the one place gpupool decides placements.

A cycle is a short sequence of steps, each reported to an optional observer (which may time them):
 1. open the session: working state and fair shares from the snapshot;
 2. tear down gangs that lost members;
 3. allocate free capacity;
 4. reclaim for projects below their fair share;
 5. preempt lower-priority work within a project;
 6. consolidate (opt-in);
 7. explain every workload left pending.
"""

from __future__ import annotations

from collections.abc import Callable

from gpupool.core.actions.allocate import allocate
from gpupool.core.actions.consolidate import consolidate
from gpupool.core.actions.preempt import preempt
from gpupool.core.actions.reclaim import reclaim
from gpupool.core.actions.stale_gangs import evict_stale_gangs
from gpupool.core.config import SchedulerConfig
from gpupool.core.decision import Decision
from gpupool.core.explain import explain_all
from gpupool.core.model import Snapshot
from gpupool.core.placement.memo import Memo
from gpupool.core.session import Session, open_session

Observer = Callable[[str, str], None]
"""Called with (step, "start" | "end"); the core never reads a clock, the caller may."""

ACTIONS: dict[str, Callable[[Session], None]] = {
    "stale_gangs": evict_stale_gangs,
    "allocate": allocate,
    "reclaim": reclaim,
    "preempt": preempt,
    "consolidate": consolidate,
}


def schedule(
    snapshot: Snapshot, config: SchedulerConfig | None = None, observe: Observer | None = None, memo: Memo | None = None
) -> Decision:
    """Decide one cycle. `memo` may be kept between calls to reuse pure scoring work; it never changes the result."""
    config = config or SchedulerConfig()
    note = observe or _silent
    note("open", "start")
    session = open_session(snapshot, config, memo)
    note("open", "end")
    for name in config.actions:
        note(name, "start")
        ACTIONS[name](session)
        note(name, "end")
    note("explain", "start")
    pending = explain_all(session)
    note("explain", "end")
    state = session.state
    stats = dict(session.stats)
    stats.update(evicted=len(state.evictions), pending=len(pending))
    return Decision(
        binds=session.bound(),
        evictions=tuple(sorted(state.evictions, key=lambda e: e.workload)),
        pending=pending,
        shares=session.shares(),
        stats=stats,
    )


def _silent(step: str, phase: str) -> None:
    return None
