"""Reclaim: a project below its fair share (or deserved quota) takes GPUs back from projects above theirs.

Only preemptible workloads of projects over their deserved quota are victims, whatever their priority.
A reclaim never leaves a victim project (or department) below its deserved quota, nor lifts the
reclaimer above its fair share.

A project taking back its deserved quota (it stays within it) goes further, because `deserved` is a
guarantee:
- a department of it over its own quota is no bar when the GPUs come back from a sibling inside it, and
  what siblings borrow beyond their own quotas does not count against the department's room;
- minimum runtimes shield borrowed GPUs from other borrowers, not from the project they are owed to, which
  takes young workloads only when older ones will not do;
- when nothing else will do, it may take a borrower's straddling workload, one that runs partly within
  the borrower's deserved quota and partly above it, as Run:ai does. Otherwise a borrower whose only work
  above its quota is one big gang would keep an owed project waiting until the gang ends. The borrower
  then stands below its deserved quota by less than that one workload and may use its guarantee again at
  once; it cannot take the GPUs back, since the owed project is within its own deserved quota;
- a department of it may end above its fair share when only its siblings' borrowing puts it there;
- when no victim set empties a node for it, work that may not be reclaimed is moved off one (`moves`).
Each relaxation is a step tried only where the step before turned a victim away for that reason; moves
come last.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from gpupool.core import explain
from gpupool.core.decision import EvictReason, PendingCode
from gpupool.core.ordering import FairOrder
from gpupool.core.preemption.moves import place_with_moves
from gpupool.core.preemption.victims import past_min_runtime, place_with_evictions
from gpupool.core.session import Session
from gpupool.core.state import WorkloadState

RELAXATIONS = ("young", "straddle", "sibling")
"""What a quota reclaim relaxes, one step at a time after the usual rules."""

RETRYABLE = (PendingCode.NO_NODE_FITS, PendingCode.GANG_UNPLACEABLE, PendingCode.NO_SHAREABLE_DEVICE)
"""Reasons eviction can cure. Queued-behind (a strict-FIFO head waits) is not one: the head goes first."""


SETTLE = True
"""Stop walking the waiting workloads once none left would attempt a reclaim (see `_Walk`); off only in the
test that proves the decisions the same either way."""


def reclaim(session: Session) -> None:
    state = session.state
    failed: set[tuple[object, ...]] = set()
    attempts = 0
    moves_left = session.config.max_move_attempts
    no_room: set[object] = set()
    deserved = session.deserved
    waiting = [ws for ws in session.waiting() if _retryable(session, ws)]
    walk = _Walk(session, waiting, failed) if SETTLE else None
    if walk is not None and not walk.live:
        return
    for ws in FairOrder(session, waiting, on_block=walk.gone if walk else None):
        if walk is not None:
            walk.gone(ws)
        if attempts >= session.config.max_preemption_attempts:
            break
        chain = state.tree.chain[ws.queue]
        nominal = ws.w.request.nominal_milli() * ws.w.gang_size
        if not nominal:
            continue  # fair shares are in GPUs: they give CPU-only work no claim on anyone's GPUs
        # Entitled where the project itself stays within its fair share; its departments are checked on the
        # outcome (`valid`), since taking from a sibling leaves their usage as it was.
        entitled = [p for p in _pools(session, ws) if _within(session, chain[:1], p, nominal, session.fair)]
        key = _key(ws)
        if not entitled or key in failed:
            continue
        attempts += 1
        # Within its own deserved quota; its departments are checked against each victim (`_rules`).
        by_quota = {p: _within(session, chain[:1], p, nominal, deserved) for p in entitled}
        message = f"reclaimed for a workload of project {ws.w.project}, which is below its fair share"
        evicted: int | None = None
        owed: dict[int, bool] = {p: True for p, ok in by_quota.items() if ok}
        # The usual rules first; a project owed GPUs then relaxes them one step at a time, where an earlier
        # step turned a victim away for just that reason (else the step could find nothing new).
        held: set[str] = set()
        moved = 0
        for step in (None, *RELAXATIONS):
            pools = owed if step else by_quota
            if evicted is not None or not pools or (step and step not in held):
                continue
            # A step relaxes its own rule, and the earlier ones only where they turned a victim away too.
            upto = RELAXATIONS[: RELAXATIONS.index(step) + 1] if step else ()
            relaxed = frozenset(r for r in upto if r in held)
            victim_queues, eligible, valid = _rules(session, ws, pools, nominal, relaxed, held)
            evicted = place_with_evictions(session, ws, victim_queues, eligible, valid, EvictReason.RECLAIM, message)
        if evicted is None and owed and moves_left > 0 and ws.w.gang_size == 1:
            moves_left -= 1
            victim_queues, eligible, valid = _rules(session, ws, owed, nominal, frozenset(held), held)
            found = place_with_moves(session, ws, victim_queues, eligible, valid, message, owed.__contains__, no_room)
            if found is not None:
                evicted, moved = found
        if evicted is None:
            failed.add(key)
            if walk is not None and walk.failed_now(key):
                break
            continue
        state.commit()
        no_room.clear()
        session.stats["reclaimed"] += evicted - moved
        session.stats["moved"] += moved
        session.pending[ws.idx] = explain.waiting(ws, evicted)
        if walk is not None and walk.changed():
            break


class _Walk:
    """Which classes of workloads (`Session.classes`) are left to walk and might still attempt a reclaim.

    A workload attempts one only when its project stays within its fair share in some pool it may use and
    its class has not failed one before: the same for its whole class, and changed only by an attempt (a
    failed one is rolled back; a reclaim changes the usage of the projects involved). Skipping a workload
    changes nothing, so once no class left might attempt, the walk is over."""

    def __init__(self, session: Session, waiting: list[WorkloadState], failed: set[tuple[object, ...]]) -> None:
        self.session, self.failed = session, failed
        self.classes = session.classes()
        self.left = Counter(self.classes[ws.idx] for ws in waiting)
        self.sample = {self.classes[ws.idx]: ws for ws in waiting}
        self.by_queue: dict[int, list[int]] = {}
        for c, ws in self.sample.items():
            self.by_queue.setdefault(ws.queue, []).append(c)
        self.of_key: dict[tuple[object, ...], list[int]] = {}
        for c, ws in self.sample.items():
            self.of_key.setdefault(_key(ws), []).append(c)
        self.seen = [list(row) for row in session.state.used]
        self.live = {c for c in self.left if self._might(self.sample[c])}

    def gone(self, ws: WorkloadState) -> None:
        c = self.classes[ws.idx]
        self.left[c] -= 1
        if not self.left[c]:
            self.live.discard(c)

    def changed(self) -> bool:
        """Re-judge after an attempt the classes of every project whose usage changed (a class that failed is
        out for good). True when none is left that might attempt."""
        used = self.session.state.used
        for q, row in enumerate(used):
            if row != self.seen[q]:
                self.seen[q] = list(row)
                for c in self.by_queue.get(q, ()):
                    if self.left[c] > 0 and self._might(self.sample[c]):
                        self.live.add(c)
                    else:
                        self.live.discard(c)
        return not self.live

    def failed_now(self, key: tuple[object, ...]) -> bool:
        """A class that failed is out for good; True when none is left that might attempt."""
        self.live.difference_update(self.of_key.get(key, ()))
        return self.changed()

    def _might(self, ws: WorkloadState) -> bool:
        session = self.session
        nominal = ws.w.request.nominal_milli() * ws.w.gang_size
        if not nominal or _key(ws) in self.failed:
            return False
        chain = session.state.tree.chain[ws.queue]
        return any(_within(session, chain[:1], p, nominal, session.fair) for p in _pools(session, ws))


def mixed_rules(
    session: Session, ws: WorkloadState, own: dict[int, int]
) -> tuple[list[int], Callable[[WorkloadState], bool], Callable[[], bool], str] | None:
    """For a victim set that mixes a preemptor's own lower-priority work (`own`: pool -> what it holds) with
    other projects' borrowed work (see `preempt`): the victim queues, victim test and final check of a reclaim
    under the usual rules, in the pools where the workload would take its project past its fair share (else
    reclaim alone serves) and its own victims could bring it back within (the final check asks that), and the
    message its victims get. None where there are none."""
    state = session.state
    nominal = ws.w.request.nominal_milli() * ws.w.gang_size
    chain = state.tree.chain[ws.queue]
    used, fair = state.used[ws.queue], session.fair[ws.queue]
    pools = {
        p: _within(session, chain[:1], p, nominal, session.deserved)
        for p in _pools(session, ws)
        if used[p] + nominal > fair[p] >= used[p] + nominal - own.get(p, 0)
    }
    if not nominal or not pools:
        return None
    queues, eligible, valid = _rules(session, ws, pools, nominal, frozenset(), set())
    if not queues:
        return None
    return queues, eligible, valid, f"reclaimed for a workload of project {ws.w.project}, which is below its fair share"


def _retryable(session: Session, ws: WorkloadState) -> bool:
    reason = session.pending.get(ws.idx)
    return reason is None or reason.code in RETRYABLE


def _key(ws: WorkloadState) -> tuple[object, ...]:
    """What a failed attempt is remembered by: the same for every workload it would fail alike."""
    return (ws.queue, ws.w.request, ws.w.pools, ws.w.clusters, ws.w.gpu_models, ws.w.gang_size)


def _pools(session: Session, ws: WorkloadState) -> list[int]:
    return session.placer.candidate_pools(ws)


def _within(session: Session, chain: tuple[int, ...], p: int, nominal: int, bound: list[list[int]]) -> bool:
    return all(session.state.used[q][p] + nominal <= bound[q][p] for q in chain)


def _guaranteed(session: Session, q: int, p: int, cap: bool = True) -> int:
    """What queue q uses in pool p within deserved quotas: each project counts up to its own, each
    department (when `cap`) up to its own."""
    tree, state = session.state.tree, session.state
    kids = tree.children[q]
    total = sum(_guaranteed(session, k, p) for k in kids) if kids else state.used[q][p]
    return min(total, session.deserved[q][p]) if cap or not kids else total


def _rules(
    session: Session,
    ws: WorkloadState,
    by_quota: dict[int, bool],
    nominal: int,
    relaxed: frozenset[str],
    held: set[str],
) -> tuple[list[int], Callable[[WorkloadState], bool], Callable[[], bool]]:
    """Victim queues, the victim test and the final check of one reclaim attempt.

    Victims: preemptible work of other projects, in pools where the reclaimer is entitled. Every queue
    that loses work (up to the common ancestor) stays at or above its deserved quota and was above its
    fair share, unless the reclaimer is within its own deserved quota (quota reclaim). The reclaimer and
    its ancestors end no higher than their fair share. The `relaxed` rules apply to victims taken in a
    quota reclaim; other victims stay eligible under the usual rules beside them:
    - `young`: such victims inside their minimum runtime are eligible too;
    - `straddle`: such a victim may be larger than what its queues hold above their deserved quotas, as
      long as they hold something above it: each victim queue then loses at most one workload that takes
      it below;
    - `sibling`: a department of the reclaimer may end above its fair share where only what its other
      projects borrow beyond their deserved quotas puts it there.
    `held` collects why a victim or a victim set a quota reclaim could take was turned away.
    """
    young, straddle, sibling = ("young" in relaxed), ("straddle" in relaxed), ("sibling" in relaxed)
    state, tree = session.state, session.state.tree
    chain = tree.chain[ws.queue]
    shared = set(chain)
    before = [list(state.used[q]) for q in chain]
    cache: dict[tuple[int, int], int] = {}
    seen = [state.generation]

    # A department of the reclaimer that would grow (the victim is outside it) must have room under its fair
    # share, and for a quota reclaim under its deserved quota too: taking from a sibling inside it is fine
    # even when it has none. What siblings borrow above their own deserved quotas does not count against
    # that room: a project's deserved quota is guaranteed whatever its siblings borrow, and once the
    # department stands above its quota, their borrowed GPUs are the ones other departments may take back.
    room = {(q, p): state.used[q][p] + nominal <= session.fair[q][p] for q in chain[1:] for p in by_quota}
    quota_room = {
        (q, p): _guaranteed(session, q, p, cap=False) + nominal <= session.deserved[q][p]
        for q in chain[1:]
        for p in by_quota
    }

    def quota_reclaim(queue: int, p: int) -> bool:
        """Whether taking from `queue` keeps the reclaimer, and each department of it that grows, within
        their deserved quotas."""
        theirs = tree.chain[queue]
        return by_quota[p] and all(quota_room[(q, p)] for q in chain[1:] if q not in theirs)

    def headroom(queue: int, p: int) -> int:
        """How much GPU this queue may lose in pool p (negative: none)."""
        if seen[0] != state.generation:
            cache.clear()
            seen[0] = state.generation
        key = (queue, p)
        spare = cache.get(key)
        if spare is None:
            spare = 1 << 62
            owed = quota_reclaim(queue, p)
            for q in tree.chain[queue]:
                if q in shared:
                    continue
                used = state.used[q][p]
                if not (used > session.fair[q][p] or owed):
                    spare = -1
                    break
                spare = min(spare, used - session.deserved[q][p])
            cache[key] = spare
        return spare

    victim_queues = [
        q
        for q in range(len(tree.queues))
        if q != ws.queue and not tree.children[q] and any(headroom(q, p) > 0 for p in by_quota)
    ]

    def eligible(v: WorkloadState) -> bool:
        p = v.pool_idx
        if v.queue == ws.queue or not v.w.preemptible or p not in by_quota or not v.milli:
            return False
        theirs = tree.chain[v.queue]
        owed = quota_reclaim(v.queue, p)
        roomy = all(room[(q, p)] for q in chain[1:] if q not in theirs)
        if not roomy and not owed:
            return False
        # The relaxations add victims the reclaimer is owed; the usual ones stay eligible beside them, since
        # an owed set may need both (a sibling's young work and older work from another department).
        # Without room its department is judged on the outcome instead (`valid`): siblings may give back.
        spare = headroom(v.queue, p)
        fits = spare > 0 if straddle and owed else v.milli <= spare
        grown = (young and owed) or past_min_runtime(v, state.now)
        if owed and spare > 0:  # note every rule that turned away a victim a relaxed step could take
            if not roomy and not sibling:
                held.add("sibling")
            if v.milli <= spare and not past_min_runtime(v, state.now) and not young:
                held.add("young")
            if v.milli > spare and not straddle:
                held.add("straddle")
        return (roomy or sibling) and fits and grown

    def valid() -> bool:
        """No queue of the reclaimer grows past its fair share, except a department that a quota reclaim
        leaves above it only through what its other projects borrow beyond their deserved quotas."""
        p = ws.pool_idx
        for i, q in enumerate(chain):
            now = state.used[q][p]
            if now > before[i][p] and now > session.fair[q][p]:
                # Within its fair share but for what its projects borrow beyond their deserved quotas?
                if not (i and by_quota.get(p) and _guaranteed(session, q, p, cap=False) <= session.fair[q][p]):
                    return False
                if not sibling:
                    held.add("sibling")
                    return False
        return True

    return victim_queues, eligible, valid
