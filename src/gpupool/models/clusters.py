"""Clusters of the fleet (the hub's own and its spokes) and a workload's policy when its cluster is lost, on the
wire and as the typed values the store keeps."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from gpupool.lifecycle.phases import BurstEnd, BurstPhase
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


MICRO = 1_000_000
"""Money is kept in micro-dollars (integers); the API speaks dollars."""


class BurstSettings(Wire):
    """A cluster whose capacity is rented on demand (cluster-autoscaler behind ProvisioningRequests): what it costs,
    how long it takes, how big it may grow, and when idle capacity is given back."""

    price_per_gpu_hour: float = Field(gt=0, le=1000, allow_inf_nan=False, description="Dollars per GPU-hour.")
    delay_s: float = Field(300.0, ge=0, le=86400, allow_inf_nan=False, description="From the ask to nodes ready.")
    max_gpus: int = Field(ge=1, le=100_000, description="The most GPUs it may hold at once.")
    node_gpus: int = Field(8, ge=1, le=64, description="GPUs of one node it adds.")
    idle_release_s: float = Field(
        600.0, ge=0, le=7 * 86400, allow_inf_nan=False, description="Idle this long, a node is given back."
    )
    gpu_model: str | None = Field(
        None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._ -]*$",
        description="The GPU model its nodes have, as nodes report it: work that names GPU models bursts only here.",
    )  # fmt: skip


class BurstPublic(Reply):
    price_per_gpu_hour: float
    delay_s: float
    max_gpus: int
    node_gpus: int
    idle_release_s: float
    gpu_model: str | None = None


class DepartmentBurstSet(Wire):
    """When a department's work may burst: once it has waited `after_s`, within `monthly_budget` dollars a month.
    Both null: it never bursts."""

    after_s: float | None = Field(None, ge=0, le=30 * 86400, allow_inf_nan=False)
    monthly_budget: float | None = Field(None, ge=0, le=1e9, allow_inf_nan=False, description="Dollars a month.")
    paced: bool = Field(True, description="The budget accrues evenly over the month; false: all of it from day one.")
    stop_at_budget: bool = Field(
        True, description="Work on its rented nodes is stopped once the budget is spent; false: it runs to its end."
    )


class DepartmentBurstPublic(Reply):
    department: str
    after_s: float | None
    monthly_budget: float | None
    """Dollars a month; null: it never bursts."""
    paced: bool = True
    stop_at_budget: bool = True
    spent: float = 0.0
    """Dollars billed this calendar month (UTC) to now, for every node rented for it, busy or idle."""
    forecast: float = 0.0
    """Dollars the month comes to at this month's pace so far (spent × month length / time elapsed)."""
    rate_per_hour: float = 0.0
    """Dollars an hour the nodes it holds now cost."""
    nodes: int = 0
    """Rented nodes it holds now: asked for, provisioning or ready."""
    refused: str | None = None
    """Why its waiting work got no burst node at the hub's last try: over-budget or pools-full; null: it did."""


class ClusterCreate(Wire):
    name: Name
    kubeconfig: str | None = Field(
        None, max_length=1_000_000, description="The kubeconfig the hub reaches the cluster with (kept as a secret)."
    )
    local: bool = Field(False, description="This host, run by the hub's local backend.")
    pool_label: str | None = Field(None, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
    pool_scope: PoolScope = PoolScope.GLOBAL
    burst: BurstSettings | None = None
    """Set for capacity rented on demand: the hub asks for nodes through a ProvisioningRequest only when work has
    waited past its department's threshold, within its budget."""


class ClusterPublic(Reply):
    name: str
    kind: ClusterKind
    status: ClusterStatus
    draining: bool
    pool_scope: PoolScope
    pool_label: str | None = None
    burst: BurstPublic | None = None
    last_seen_at: float | None = None
    down_since: float | None = None
    nodes: int = 0
    gpus: int = 0
    """Whole devices of its schedulable nodes."""
    allocated_gpus: float = 0.0
    """GPUs its live workloads hold (fractions count as such)."""
    workloads: int = 0
    """Live workloads with members there."""


class BurstNodePublic(Reply):
    """A node rented from a burst cluster: one ProvisioningRequest, who pays for it and what it has cost."""

    name: str
    """Its ProvisioningRequest's name."""
    department: str
    phase: BurstPhase
    node: str | None = None
    gpus: int
    price_per_gpu_hour: float
    asked_at: float
    ready_at: float | None = None
    released_at: float | None = None
    end_reason: BurstEnd | None = None
    message: str | None = None
    cost: float
    """Dollars from its ask to its release (or now)."""


class ClusterDetail(ClusterPublic):
    pools: list[str] = Field(default_factory=list)
    node_names: list[str] = Field(default_factory=list)
    running: list[str] = Field(default_factory=list)
    """The live workloads with members there, as `project/name`."""
    burst_nodes: list[BurstNodePublic] = Field(default_factory=list)
    """A burst cluster's rented nodes: those not given back, and those given back in the last day (newest first)."""


class ClusterDrain(Wire):
    draining: bool = True
