"""Workload, allocation and burst-node phases, and the reasons a workload waits or stops. Persisted as their string
values."""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    PENDING = "pending"
    """Queued: never started (or cancelled before it did), or failed and waiting to be retried (held until its
    backoff is over, then queued again)."""
    STARTING = "starting"
    """Placed: its members are being launched and, for apps, have not answered yet."""
    RUNNING = "running"
    PREEMPTED = "preempted"
    """Stopped by the scheduler and queued again in its old place."""
    SUSPENDED = "suspended"
    """A notebook stopped by the scheduler (preempted, reclaimed, moved: queued again at once in its old place,
    so it starts again by itself when there is room) or by a policy (held until resumed); its files stay."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


QUEUED = frozenset({Phase.PENDING, Phase.PREEMPTED, Phase.SUSPENDED})
"""Waiting for the scheduler (unless held)."""
LIVE = frozenset({Phase.STARTING, Phase.RUNNING})
"""Holding devices: its members run or are being launched or stopped."""
ACTIVE = QUEUED | LIVE
TERMINAL = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED})


class AllocPhase(StrEnum):
    """One member of one attempt on a node."""

    BOUND = "bound"
    """Persisted, not launched yet: a crash here relaunches it by its id, never twice."""
    LAUNCHED = "launched"
    READY = "ready"
    """Launched, and for an app, answering."""
    ENDED = "ended"


HOLDING = frozenset({AllocPhase.BOUND, AllocPhase.LAUNCHED, AllocPhase.READY})
"""Phases in which an allocation holds its devices."""
STARTED = frozenset({AllocPhase.LAUNCHED, AllocPhase.READY})
"""Phases in which a member's processes exist."""


class StopReason(StrEnum):
    """Why a live workload's members are being stopped; it decides what the workload becomes once they are gone."""

    CANCEL = "cancel"
    RECLAIM = "reclaim"
    """Taken back for a project below its fair share or deserved quota."""
    PREEMPT = "preempt"
    """Preempted by a higher-priority workload of the same project."""
    CONSOLIDATE = "consolidate"
    """Moved to make room for a workload that fits nowhere else."""
    GANG_BROKEN = "gang-broken"
    NODE_LOST = "node-lost"
    CLUSTER_LOST = "cluster-lost"
    """Its cluster stayed down past the workload's policy: requeued elsewhere (what ran there is stopped if the
    cluster comes back)."""
    BURST_BUDGET = "burst-budget"
    """It ran on a rented node whose department's spending reached its burst budget: requeued (with its last
    checkpoint), so the node empties and goes back."""
    MEMBER_FAILED = "failed"
    """One member exited non-zero: the rest of the gang cannot go on without it."""
    IDLE = "idle"
    MAX_RUNTIME = "max-runtime"


REQUEUES = frozenset(
    {
        StopReason.RECLAIM,
        StopReason.PREEMPT,
        StopReason.CONSOLIDATE,
        StopReason.GANG_BROKEN,
        StopReason.NODE_LOST,
        StopReason.CLUSTER_LOST,
        StopReason.BURST_BUDGET,
    }
)
"""Not the workload's doing: it goes back in the queue in its old place."""
POLICY_STOPS = frozenset({StopReason.IDLE, StopReason.MAX_RUNTIME})
EVICTIONS = REQUEUES | POLICY_STOPS
"""What `gpupool_evictions_total` counts: stops by the scheduler or a policy, not by the user or the workload."""


class Resumes(StrEnum):
    """How a suspended notebook comes back."""

    AUTOMATICALLY = "automatically"
    """Stopped by the scheduler (REQUEUES), or resumed by someone: queued, it starts when there is room."""
    ON_RESUME = "on-resume"
    """Stopped by a policy (POLICY_STOPS): held until its owner resumes it (`gpupool resume`, the portal)."""


class PendingReason(StrEnum):
    """Why a queued workload has not started. The scheduler's codes (the core's PendingCode, same values) plus
    the states it has before and outside the scheduler's view."""

    WAITING = "waiting"
    """Submitted; no cycle has looked at it yet."""
    OVER_LIMIT = "over-limit"
    NONPREEMPTIBLE_OVER_DESERVED = "nonpreemptible-over-deserved"
    OVER_DESERVED = "over-deserved"
    MIN_RUNTIME = "min-runtime"
    NO_NODE_FITS = "no-node-fits"
    NEVER_FITS = "never-fits"
    GANG_UNPLACEABLE = "gang-unplaceable"
    NO_SHAREABLE_DEVICE = "no-shareable-device"
    WAITING_FOR_EVICTIONS = "waiting-for-evictions"
    QUEUED_BEHIND = "queued-behind"


class RetryOn(StrEnum):
    """Which ends of an attempt a workload's retry policy starts it again after."""

    ON_FAILURE = "on-failure"
    """A member exited non-zero (or was killed): the whole gang starts again."""
    ON_PREEMPTION = "on-preemption"
    """A stop by the scheduler (REQUEUES). Without this in its policy such a workload is queued again at once and
    without limit, as always; with it, after the backoff, and at most max_retries times."""
    ALWAYS = "always"


RETRIES_ON: dict[RetryOn, frozenset[StopReason]] = {
    RetryOn.ON_FAILURE: frozenset({StopReason.MEMBER_FAILED}),
    RetryOn.ON_PREEMPTION: REQUEUES,
    RetryOn.ALWAYS: REQUEUES | {StopReason.MEMBER_FAILED},
}
"""The stops each policy retries after. Cancels and policy stops (idle, max-runtime) are never retried."""
MAX_RETRIES = 20
RETRY_BACKOFF_CAP_S = 900.0
"""The longest a retry waits, however many came before it."""


class AttemptOutcome(StrEnum):
    """How one attempt of a workload ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """A member exited non-zero or was killed."""
    REQUEUED = "requeued"
    """Stopped by the scheduler (the reason says why)."""
    STOPPED = "stopped"
    """Stopped by a policy: idle or over its runtime."""
    CANCELLED = "cancelled"


class BurstPhase(StrEnum):
    ASKING = "asking"
    """Written before the ask: the provider may not have it yet."""
    PROVISIONING = "provisioning"
    """The provider has the request; no node yet."""
    READY = "ready"
    """Provisioned, and a node of the cluster is attributed to it."""
    RELEASING = "releasing"
    """Written before it is given back: the provider may still have it."""
    RELEASED = "released"
    """The provider confirmed it gone; billing has ended."""


class BurstEnd(StrEnum):
    """Why a burst node is given back."""

    IDLE = "idle"
    """Empty for its pool's idle time."""
    BUDGET = "budget"
    """Drained by its department's budget, and empty."""
    FAILED = "failed"
    """The provider could not provision it."""
    REVOKED = "revoked"
    """The provider took the capacity back."""
    LOST = "lost"
    """Its node left the cluster."""
    UNWANTED = "unwanted"
    """Its department or cluster no longer bursts (settings changed, or the cluster was removed)."""


HELD = frozenset({BurstPhase.ASKING, BurstPhase.PROVISIONING, BurstPhase.READY})
"""Asked for and not given back: billed, and counted against its pool's size and its department's budget."""
OPEN = HELD | {BurstPhase.RELEASING}
"""Still to be followed with the provider."""


class Offboarding(StrEnum):
    """Why an admin's offboarding cancelled someone's work (a cancel's `offboarded` argument)."""

    REMOVED = "removed"
    """Its owner was taken out of its project."""
    DISABLED = "disabled"
    DELETED = "deleted"
