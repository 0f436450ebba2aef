"""What a cycle decides: binds, evictions, and a reason for every workload left pending."""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from gpupool.core.model import Placement


class EvictReason(enum.Enum):
    RECLAIM = "reclaim"
    """Taken back for a project below its fair share or deserved quota."""
    PREEMPT = "preempt"
    """Preempted by a higher-priority workload of the same project."""
    CONSOLIDATE = "consolidate"
    """Moved to make room for a workload that fits nowhere else."""
    GANG_BROKEN = "gang-broken"
    """A gang that lost members is torn down rather than left holding GPUs."""


class PendingCode(enum.Enum):
    OVER_LIMIT = "over-limit"
    NONPREEMPTIBLE_OVER_DESERVED = "nonpreemptible-over-deserved"
    NO_NODE_FITS = "no-node-fits"
    NEVER_FITS = "never-fits"
    GANG_UNPLACEABLE = "gang-unplaceable"
    NO_SHAREABLE_DEVICE = "no-shareable-device"
    """It would fit on a device that other projects' shares hold, in a pool that does not share devices
    across projects."""
    WAITING_FOR_EVICTIONS = "waiting-for-evictions"
    QUEUED_BEHIND = "queued-behind"


@dataclass(frozen=True, slots=True)
class Bind:
    workload: str
    placements: tuple[Placement, ...]


@dataclass(frozen=True, slots=True)
class Eviction:
    workload: str
    reason: EvictReason
    message: str
    preemptor: str | None = None


@dataclass(frozen=True, slots=True)
class Pending:
    workload: str
    code: PendingCode
    message: str
    nominated: tuple[Placement, ...] = ()
    """Where it will start once the evictions it waits for have finished."""


@dataclass(frozen=True, slots=True)
class QueueShare:
    """A queue's standing in one pool this cycle (milli-GPU), for metrics and the portal."""

    queue: str
    pool: str
    deserved: int
    fair_share: int
    allocated: int
    limit: int | None
    demand: int


@dataclass(frozen=True)
class Decision:
    binds: tuple[Bind, ...] = ()
    evictions: tuple[Eviction, ...] = ()
    pending: tuple[Pending, ...] = ()
    shares: tuple[QueueShare, ...] = ()
    stats: dict[str, int] = field(default_factory=dict)

    def pending_for(self, workload: str) -> Pending | None:
        for p in self.pending:
            if p.workload == workload:
                return p
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "binds": [
                {"workload": b.workload, "placements": [_placement(p) for p in b.placements]} for b in self.binds
            ],
            "evictions": [
                {"workload": e.workload, "reason": e.reason.value, "message": e.message, "preemptor": e.preemptor}
                for e in self.evictions
            ],
            "pending": [
                {
                    "workload": p.workload,
                    "code": p.code.value,
                    "message": p.message,
                    "nominated": [_placement(x) for x in p.nominated],
                }
                for p in self.pending
            ],
            "shares": [
                {
                    "queue": s.queue,
                    "pool": s.pool,
                    "deserved": s.deserved,
                    "fair_share": s.fair_share,
                    "allocated": s.allocated,
                    "limit": s.limit,
                    "demand": s.demand,
                }
                for s in self.shares
            ],
            "stats": dict(sorted(self.stats.items())),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()


def _placement(p: Placement) -> dict[str, Any]:
    return {
        "member": p.member,
        "node": p.node,
        "devices": [[d.index, d.milli, d.memory_mib] for d in p.devices],
    }
