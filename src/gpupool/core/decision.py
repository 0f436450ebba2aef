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
    OVER_DESERVED = "over-deserved"
    """Preemptible work beyond its project's or department's deserved quota only borrows idle GPUs, and none are
    idle for it: others within their deserved quota take what frees first, and it may not reclaim."""
    NO_NODE_FITS = "no-node-fits"
    NEVER_FITS = "never-fits"
    GANG_UNPLACEABLE = "gang-unplaceable"
    NO_SHAREABLE_DEVICE = "no-shareable-device"
    """It would fit on a device that other projects' shares hold, in a pool that does not share devices
    across projects."""
    WAITING_FOR_EVICTIONS = "waiting-for-evictions"
    MIN_RUNTIME = "min-runtime"
    """It would start by evicting work that is still within its minimum runtime."""
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


Arg = tuple[str, int | str]
"""One structured argument of a pending reason: a name and an integer (resource units: milli-GPU, millicores,
MiB; times in whole seconds since the epoch; counts) or a name (a project, a pool, a node)."""


@dataclass(frozen=True, slots=True)
class Pending:
    workload: str
    code: PendingCode
    message: str
    """The sentence the core renders by default; the edge renders its own from `code` and `args` and never parses
    this back."""
    nominated: tuple[Placement, ...] = ()
    """Where it will start once the evictions it waits for have finished."""
    args: tuple[Arg, ...] = ()
    """The numbers behind the reason, as `(name, value)` pairs in a fixed order per code; hashable, so reasons
    compare whole. The names, by code (gpupool.services.reasons renders them; absent ones are unknown):

    - quota codes (over-limit, nonpreemptible-over-deserved, over-deserved): `queue` (its name), `level`
      ("project" or "department"), `pool`, `resource` ("gpu" in milli-GPU, "cpu" in millicores, "memory" in MiB),
      `used`, `quota` (the limit or deserved quota) and `asks`, all in that resource's unit;
    - the request, where a code names it (no-node-fits, gang-unplaceable, never-fits, no-shareable-device):
      `members`, and the nonzero of `gpus`, `gpu_milli`, `gpu_memory_mib`, `cpu_milli`, `memory_mib` (each member);
    - no-node-fits, gang-unplaceable: `node`, the closest node, and what it lacks for one member: `lacks_gpus`
      (whole free devices), `lacks_gpu_milli`, `lacks_cpu_milli`, `lacks_memory_mib`; a gang's also `fits`, the
      members its best pool could host now;
    - no-shareable-device: `pool`;
    - waiting-for-evictions: `victims`, `gpu_milli` (what they free), `borrowers` (the victims' projects other
      than its own, comma-separated, sorted), `nodes` (comma-separated);
    - min-runtime: `until` (seconds since the epoch, whole), `victim` (its shown name; absent for another
      project's), `project` (the victim's), `gpu_milli`;
    - queued-behind: `ahead` (higher-priority workloads of its project), `project`, `blocker` (the code it would
      have otherwise, or "fifo-head" for a strict-FIFO project's head) followed by that code's own arguments."""

    def arg(self, name: str) -> int | str | None:
        for key, value in self.args:
            if key == name:
                return value
        return None

    def to(self, workload: str) -> Pending:
        """The same reason for another workload of the same class (no nomination: that is the workload's own)."""
        return Pending(workload, self.code, self.message, (), self.args)


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
                    "args": [list(a) for a in p.args],
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
