"""When will pending work start? The same `schedule()` run forward over the ends of running work.

From the live snapshot, every running workload is expected to end at its start plus its expected runtime (a
`Runtime`: the declared maximum, or a prediction from history, see `runtime_model`); work that starts on the
way is expected to run its own runtime, and work evicted on the way starts over. No arrivals are assumed. The
forecast decides at `now`, then steps forward: at each step, the work whose end has come is gone and the core
decides again at that time, exactly as a live cycle would (minimum runtimes, quotas, reclaim and preemption
included, and a decision with evictions is followed by another at the same time, as evictions release). A
pending workload's estimate is the time of the step at which it is bound, resting on the weakest basis of the
ends that came before (`Basis.DECLARED` when it waits for none). A workload still pending when the forecast
stops gets no time, and the code and sentence of the reason the core gave at the last step: "not while that
holds".

Cost. A step costs one cycle of the core's actions on the forward snapshot (`schedule()` without the wording
of every pending reason; one more per round of evictions, at most `EVICTION_ROUNDS`), and the last step one
`schedule()` for the reasons of what is left. Steps are taken at the next end or minimum-runtime expiry, but at
least `min_step_s` and `resolution` times the lookahead so far apart (ends closer than that are taken together at
the later time, so an estimate is late by at most that share of its wait), and at most `max_steps`: with the
defaults, 64 steps reach about 14 days ahead when ends are dense. The typical mix and model demand of the live
snapshot are kept for every step, so placement scores computed once are reused through `memo`. A `Forecast` is
advanced a step at a time, so a caller with a clock can spread one over several cycles under a time budget per
cycle and publish it when `done`; its result does not depend on how the steps were spread. Pure and
deterministic: the core reads no clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from gpupool.core.config import SchedulerConfig
from gpupool.core.cycle import ACTIONS, schedule
from gpupool.core.decision import Bind, Pending, PendingCode
from gpupool.core.model import Snapshot, State, Workload
from gpupool.core.placement.memo import Memo
from gpupool.core.runtime_model import UNKNOWN, Basis, Runtime, RuntimeModel
from gpupool.core.session import derive_mix, derive_model_demand, open_session

EVICTION_ROUNDS = 3
_ORDER = (Basis.DECLARED, Basis.HISTORY, Basis.NONE)


@dataclass(frozen=True, slots=True)
class Limits:
    max_steps: int = 64
    """Forward decisions at most (rounds for evictions not counted)."""
    resolution: float = 0.15
    """Steps are at least this share of the lookahead apart."""
    min_step_s: float = 60.0
    """Steps are at least this far apart (the live cycle's cadence, or coarser)."""
    releasing_s: float = 30.0
    """How long a workload already releasing is expected to keep its devices."""

    def __post_init__(self) -> None:
        if self.max_steps < 1 or self.resolution < 0 or self.min_step_s <= 0 or self.releasing_s < 0:
            raise ValueError("max_steps must be at least 1, min_step_s positive, the others not negative")


@dataclass(frozen=True, slots=True)
class Estimate:
    workload: str
    start: float | None
    """When it is expected to be bound; None: not while `code` holds."""
    basis: Basis
    code: PendingCode | None = None
    """Without a start: the reason the core gave at the forecast's last step."""
    message: str = ""
    beyond: bool = False
    """Without a start: the step budget ran out while running work was still expected to end."""


class Forecast:
    """One forecast from one snapshot, advanced by `step()` until `done`, then read with `estimates()`."""

    def __init__(
        self,
        snapshot: Snapshot,
        runtimes: Mapping[str, Runtime],
        config: SchedulerConfig | None = None,
        limits: Limits | None = None,
        memo: Memo | None = None,
    ) -> None:
        config = config or SchedulerConfig()
        # The typical mix and the model demand stay those of the live snapshot: what is running and waiting now
        # is the best guess of what will be, and scores computed for one mix are reused across steps.
        self.config = dataclasses.replace(
            config,
            typical_mix=(
                config.typical_mix if config.typical_mix is not None else derive_mix(snapshot, config.mix_coverage_pct)
            ),
            model_demand=config.model_demand if config.model_demand is not None else derive_model_demand(snapshot),
        )
        self.limits, self.memo = limits or Limits(), memo
        self.now = snapshot.now
        self.steps = 0
        """Forward decisions taken so far."""
        self.cycles = 0
        """`schedule()` calls so far (steps plus eviction rounds)."""
        self.done = False
        self._snapshot = snapshot
        self._runtimes = runtimes
        self._t = snapshot.now
        self._basis = Basis.DECLARED
        self._ends: dict[str, tuple[float, Basis]] = {}
        self._workloads: dict[str, Workload] = {w.id: w for w in snapshot.workloads}
        self._waiting = {w.id for w in snapshot.workloads if w.state is State.PENDING}
        self._found: dict[str, Estimate] = {}
        self._beyond = False
        for w in snapshot.workloads:
            if w.state is State.RUNNING:
                self._expect_end(w, w.start_time if w.start_time is not None else self.now)
            elif w.state is State.RELEASING:
                self._ends[w.id] = (self.now + self.limits.releasing_s, Basis.DECLARED)

    def step(self) -> bool:
        """Take one forward step; True while there is more to do."""
        if self.done:
            return False
        if self.steps > 0:
            at = self._next_time()
            if at is None:
                return self._finish()
            self._release(at)
        self._decide()
        self.steps += 1
        if not self._waiting:
            return self._finish()
        if self.steps >= self.limits.max_steps:
            self._beyond = self._next_time() is not None
            return self._finish()
        return True

    @property
    def at(self) -> float:
        """The time of the latest step."""
        return self._t

    def run(self) -> dict[str, Estimate]:
        while self.step():
            pass
        return self.estimates()

    def estimates(self) -> dict[str, Estimate]:
        """Per workload pending in the snapshot, its estimate (complete once `done`)."""
        return dict(self._found)

    # -- the forward run ---------------------------------------------------------------------------------

    def _expect_end(self, w: Workload, start: float) -> None:
        runtime = self._runtimes.get(w.id, UNKNOWN)
        if runtime.seconds is not None:
            # Overdue work (it has run past what was expected) ends at the next step rather than in the past.
            self._ends[w.id] = (max(start + runtime.seconds, self._t), runtime.basis)

    def _next_time(self) -> float | None:
        t = self._t
        events = [end for end, _ in self._ends.values()]
        events.extend(
            w.start_time + w.min_runtime_s
            for w in self._workloads.values()
            if w.state is State.RUNNING and w.preemptible and w.min_runtime_s and w.start_time is not None
        )
        upcoming = [e for e in events if e > t]
        if not upcoming and not any(end <= t for end, _ in self._ends.values()):
            return None
        gap = max(self.limits.min_step_s, self.limits.resolution * (t - self.now))
        return max(min(upcoming, default=t), t + gap)

    def _release(self, at: float) -> None:
        for wid, (end, basis) in list(self._ends.items()):
            if end <= at:
                del self._ends[wid]
                del self._workloads[wid]
                if _ORDER.index(basis) > _ORDER.index(self._basis):
                    self._basis = basis
        self._t = at

    def _decide(self) -> None:
        at = self._t
        for _ in range(EVICTION_ROUNDS):
            binds, evictions, nominated = self._cycle(at)
            for wid in evictions:
                w = self._workloads[wid]
                self._ends.pop(w.id, None)
                self._workloads[w.id] = dataclasses.replace(
                    w, state=State.PENDING, placements=(), start_time=None, nominated_nodes=nominated.get(w.id, ())
                )
            for b in binds:
                w = dataclasses.replace(
                    self._workloads[b.workload],
                    state=State.RUNNING,
                    placements=b.placements,
                    start_time=at,
                    nominated_nodes=(),
                )
                self._workloads[w.id] = w
                self._expect_end(w, at)
                if w.id in self._waiting:
                    self._waiting.discard(w.id)
                    self._found[w.id] = Estimate(w.id, at, self._basis)
            for wid, w in self._workloads.items():  # as the control plane keeps nominations, and drops them
                if w.state is State.PENDING and w.nominated_nodes != nominated.get(wid, ()):
                    self._workloads[wid] = dataclasses.replace(w, nominated_nodes=nominated.get(wid, ()))
            if not evictions:
                break

    def _cycle(self, at: float) -> tuple[tuple[Bind, ...], list[str], dict[str, tuple[str, ...]]]:
        """One cycle of the core's actions at `at`, as `schedule()` runs them, without the wording of every
        pending reason (only the last step's are read, `_finish` asks for them): binds, evicted workloads, and
        the nodes each workload waiting for evictions will start on."""
        snapshot = dataclasses.replace(self._snapshot, workloads=tuple(self._workloads.values()), now=at)
        session = open_session(snapshot, self.config, self.memo)
        for name in self.config.actions:
            ACTIONS[name](session)
        self.cycles += 1
        nominated: dict[str, tuple[str, ...]] = {}
        for ws in session.state.workloads:
            if ws.bound and ws.pipelined:
                reason = session.pending.get(ws.idx)
                where = reason.nominated if reason is not None and reason.nominated else ws.placements
                nominated[ws.w.id] = tuple(sorted({p.node for p in where}))
        return session.bound(), sorted(e.workload for e in session.state.evictions), nominated

    def _finish(self) -> bool:
        reasons: dict[str, Pending] = {}
        if self._waiting:
            snapshot = dataclasses.replace(self._snapshot, workloads=tuple(self._workloads.values()), now=self._t)
            reasons = {p.workload: p for p in schedule(snapshot, self.config, memo=self.memo).pending}
            self.cycles += 1
        for wid in sorted(self._waiting):
            reason = reasons.get(wid)
            self._found[wid] = Estimate(
                wid,
                None,
                Basis.NONE,
                reason.code if reason is not None else None,
                reason.message if reason is not None else "",
                self._beyond,
            )
        self._waiting.clear()
        self.done = True
        return False


def forecast(
    snapshot: Snapshot,
    runtimes: Mapping[str, Runtime],
    config: SchedulerConfig | None = None,
    limits: Limits | None = None,
    memo: Memo | None = None,
) -> dict[str, Estimate]:
    """Every pending workload's estimated start, the forecast run to its end in one call."""
    return Forecast(snapshot, runtimes, config, limits, memo).run()


def runtimes_for(
    snapshot: Snapshot, model: RuntimeModel, declared: Mapping[str, float] | None = None
) -> dict[str, Runtime]:
    """The runtimes a forecast assumes: per workload, `model.expect` by its project and priority class (the
    workload type), capped by its declared maximum duration in `declared` (seconds, by workload id); running
    work is predicted from what it has already run."""
    declared = declared or {}
    out: dict[str, Runtime] = {}
    for w in snapshot.workloads:
        elapsed = snapshot.now - w.start_time if w.state is State.RUNNING and w.start_time is not None else 0.0
        out[w.id] = model.expect(w.project, w.priority_class, declared.get(w.id), elapsed)
    return out
