"""Clusters of the fleet (the hub's own and its spokes) and a workload's policy when its cluster is lost, on the
wire and as the typed values the store keeps."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from gpupool.models.wire import Name, Reply, Wire

CLUSTER_LOST_AFTER_S = 900.0
"""How long a workload's cluster may stay down before the workload is requeued elsewhere, by default (MultiKueue's
workerLostTimeout is the same 15 minutes). Notebooks wait instead: their files are on that cluster."""
MAX_LOST_AFTER_S = 7 * 86400


class ClusterKind(StrEnum):
    HOME = "home"
    """The hub's own backend (the server's settings choose it): always there, never removed."""
    KUBERNETES = "kubernetes"
    LOCAL = "local"


class ClusterStatus(StrEnum):
    UNKNOWN = "unknown"
    """Added, not reached yet."""
    UP = "up"
    DOWN = "down"
    """Not reached for longer than the hub's threshold: takes no new work; its workloads follow their policy."""


class PoolScope(StrEnum):
    GLOBAL = "global"
    """Its pools are the fleet's: a pool of the same name elsewhere is the same pool, under the same quotas."""
    CLUSTER = "cluster"
    """Its pools are its own (`<cluster>-<pool>`): quotas set on them hold in this cluster only."""


class ClusterLostPolicy(Wire):
    """What a workload does when its cluster goes down: wait for it to come back, or be requeued elsewhere once it
    has been down `after_s` (training then starts again from its last checkpoint, if it keeps one)."""

    action: Literal["wait", "requeue"] = "requeue"
    after_s: float = Field(CLUSTER_LOST_AFTER_S, ge=0, le=MAX_LOST_AFTER_S, allow_inf_nan=False)


class ClusterLostPolicyPublic(Reply):
    """A workload's ClusterLostPolicy as the API shows it (a reply: a newer server's fields are read, not refused)."""

    action: Literal["wait", "requeue"]
    after_s: float


class ClusterCreate(Wire):
    name: Name
    kubeconfig: str | None = Field(
        None, max_length=1_000_000, description="The kubeconfig the hub reaches the cluster with (kept as a secret)."
    )
    local: bool = Field(False, description="This host, run by the hub's local backend.")
    pool_label: str | None = Field(None, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
    pool_scope: PoolScope = PoolScope.GLOBAL


class ClusterPublic(Reply):
    name: str
    kind: ClusterKind
    status: ClusterStatus
    draining: bool
    pool_scope: PoolScope
    pool_label: str | None = None
    last_seen_at: float | None = None
    down_since: float | None = None
    nodes: int = 0
    gpus: int = 0
    """Whole devices of its schedulable nodes."""
    allocated_gpus: float = 0.0
    """GPUs its live workloads hold (fractions count as such)."""
    workloads: int = 0
    """Live workloads with members there."""


class ClusterDetail(ClusterPublic):
    pools: list[str] = Field(default_factory=list)
    node_names: list[str] = Field(default_factory=list)
    running: list[str] = Field(default_factory=list)
    """The live workloads with members there, as `project/name`."""


class ClusterDrain(Wire):
    draining: bool = True
