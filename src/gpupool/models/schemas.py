"""Wire models of quotas, policies, workloads and nodes: what the API accepts and returns. Limits are declared
once, here and in models/wire.py.

The client and the CLI import these too, so this module depends on pydantic only.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Generic, Literal

from pydantic import Field, JsonValue, field_validator

from gpupool.models import imageref
from gpupool.models.attempts import AttemptPublic, HistoryItem, RetryPolicy
from gpupool.models.clusters import CLUSTER_LOST_AFTER_S, ClusterLostPolicy, ClusterLostPolicyPublic
from gpupool.models.rightsizing import RightsizingAdvice
from gpupool.models.volumes import VolumeMount
from gpupool.models.wire import (
    CODE_DIGEST,
    Name,
    PolicySeconds,
    Reply,
    SeenAllocState,
    SeenState,
    ShortText,
    T,
    Wire,
    WorkloadType,
)


class QuotaIn(Wire):
    pool: Name = "default"
    deserved_gpus: float = Field(0, ge=0, le=1_000_000, allow_inf_nan=False)
    limit_gpus: float | None = Field(None, ge=0, le=1_000_000, allow_inf_nan=False)
    weight: int = Field(1, ge=0, le=1000)


class DepartmentCreate(QuotaIn):
    name: Name


class ProjectCreate(QuotaIn):
    name: Name
    department: Name | None = None
    strict_fifo: bool = False


class QuotaUpdate(Wire):
    pool: Name = "default"
    deserved_gpus: float | None = Field(None, ge=0, le=1_000_000, allow_inf_nan=False)
    limit_gpus: float | None = Field(None, ge=0, le=1_000_000, allow_inf_nan=False)
    clear_limit: bool = False
    weight: int | None = Field(None, ge=0, le=1000)


class QuotaPublic(Reply):
    pool: str
    deserved_gpus: float
    limit_gpus: float | None
    weight: int


class QueuePublic(Reply):
    name: str
    kind: Literal["department", "project"]
    parent: str | None
    quotas: list[QuotaPublic]
    strict_fifo: bool = False
    allocated_gpus: float = 0
    """GPUs its running workloads hold now (all pools)."""
    production_allowed: bool = False
    pod_security: str = "restricted"
    host_network: bool = False
    mlflow_uri: str | None = None


Kind = Literal["notebook", "training", "inference", "batch"]


class PolicyUpdate(Wire):
    """Seconds per workload type; null removes a limit. A project may only tighten its department's limits."""

    idle_timeout_s: dict[Kind, PolicySeconds | None] = Field(default_factory=dict)
    max_runtime_s: dict[Kind, PolicySeconds | None] = Field(default_factory=dict)
    idle_threshold_pct: int | None = Field(None, ge=0, le=100)


class PolicyPublic(Reply):
    queue: str
    own: dict[str, object]
    """What this queue sets itself."""
    idle_timeout_s: dict[str, float]
    max_runtime_s: dict[str, float]
    idle_threshold_pct: int
    source: dict[str, str]
    """Which queue each effective limit comes from."""


class UsageLine(Reply):
    key: str
    gpu_hours: float
    busy_gpu_hours: float
    idle_gpu_hours: float
    cost: float
    """Dollars: on_prem_cost + burst_cost."""
    busy_cost: float
    idle_cost: float
    on_prem_cost: float = 0.0
    """Dollars of the usage on the fleet's own nodes, at its pool's price (the server's `prices`)."""
    burst_cost: float = 0.0
    """Dollars of the usage on rented (burst) nodes, at the price each node was rented at."""
    burst_gpu_hours: float = 0.0
    """The part of gpu_hours on rented nodes."""
    runs: int = 0
    """The workloads it sums: by workload, the runs of that name in the period (a finished name submitted again
    is the same line, its runs counted)."""


class BudgetLine(Reply):
    """A department's burst spending: its calendar month (UTC) to now, and the report's period."""

    department: str
    monthly_budget: float | None
    """Dollars a month; null: it never bursts."""
    spent: float
    """Dollars billed this month to now: every rented node from its ask to its release, busy or idle."""
    forecast: float
    """Dollars the month comes to at this month's pace so far: spent × month length / time elapsed."""
    rate_per_hour: float
    """Dollars an hour the nodes it holds now cost (those not given back yet)."""
    rented_gpu_hours: float
    """GPU-hours of rented nodes within the report's period (to now at most)."""
    rented_cost: float
    """Dollars billed for them within the period."""
    unused_cost: float
    """rented_cost less the burst cost of its projects' usage in the period (not below 0): rented, never used."""
    refused: str | None
    """Why its waiting work got no burst node at the hub's last try: over-budget or pools-full; null: it did."""


class UsageReport(Reply):
    start: float
    end: float
    by: Literal["department", "project", "user", "workload"]
    lines: list[UsageLine]
    total: UsageLine
    budgets: list[BudgetLine] = Field(default_factory=list)
    """One line per department the caller sees that has a burst budget or a bill in the period."""
    unpriced_pools: list[str] = Field(default_factory=list)
    """Pools with usage in the report and no price set (the server's `prices`): their cost counts as 0."""


CODE_DESCRIPTION = (
    "The code it runs in: `sha256:<hex>` of a code manifest its project uploaded (gpupool.client.code.upload); "
    "it starts in a private copy of that tree. None: an empty working directory."
)
MLFLOW_URI = r"^https?://[^\s?#]+$"
MAX_DURATION_S = 30 * 86400
"""The longest max_duration a workload may declare: a longer one says nothing a forecast could use."""


class WorkloadCreate(Wire):
    project: Name
    name: Name | None = None
    type: WorkloadType = "training"
    gpu: float | None = Field(None, allow_inf_nan=False, description="A fraction of one GPU, 0 < f < 1.")
    gpus: int | None = Field(None, ge=0, le=1024)
    gpu_memory: str | None = Field(None, max_length=32, description="Memory of one GPU, like 20GiB or 512MiB.")
    cpu: float | None = Field(None, ge=0, le=100_000, allow_inf_nan=False, description="CPU cores per member.")
    memory: str | None = Field(None, max_length=32, description="Host memory per member, like 8GiB.")
    workers: int = Field(1, ge=1, le=256)
    priority: str | None = Field(None, max_length=63)
    preemptible: bool | None = None
    port: int | None = Field(None, ge=1024, le=65535)
    env: dict[str, str] = Field(default_factory=dict, max_length=256)
    command: list[str] = Field(default_factory=list, max_length=1024)
    image: str | None = Field(None, max_length=512, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$")
    """A container image: the pod's on Kubernetes; run through podman on the local backend."""
    grace_s: float | None = Field(None, ge=0, le=3600, allow_inf_nan=False)
    max_duration_s: float | None = Field(
        None,
        gt=0,
        le=MAX_DURATION_S,
        allow_inf_nan=False,
        description="Stopped (with its grace period) once it has run this long; at most 30 days.",
    )
    pools: list[ShortText] = Field(default_factory=list, max_length=16)
    gpu_models: list[ShortText] = Field(
        default_factory=list, max_length=16, description="GPU models it accepts, as nodes name them; any where empty."
    )
    clusters: list[Name] = Field(
        default_factory=list, max_length=16, description="Clusters it accepts, in order of preference; any where empty."
    )
    on_cluster_lost: ClusterLostPolicy | None = Field(
        None, description="When its cluster goes down: notebooks wait for it by default, the rest requeue after 15m."
    )
    code: str | None = Field(None, pattern=CODE_DIGEST, description=CODE_DESCRIPTION)
    mlflow_uri: str | None = Field(
        None, max_length=512, pattern=MLFLOW_URI,
        description="An MLflow tracking server (default: its project's): it gets a run, tagged with what ran.",
    )  # fmt: skip
    model: str | None = Field(
        None, max_length=512,
        description="An inference service with no command: this MLflow model (models:/NAME/VERSION, models:/NAME@ALIAS "
        "or runs:/RUN/PATH) from its tracking server, served by MLflow's own model server on its port (8080).",
    )  # fmt: skip
    retry: RetryPolicy | None = None
    volumes: list[VolumeMount] = Field(default_factory=list, max_length=16)
    """The project's volumes it mounts, each at its own absolute path."""

    @field_validator("image")
    @classmethod
    def _image_name(cls, v: str | None) -> str | None:
        why = imageref.refused(v)
        if why is not None:
            raise ValueError(why)
        return v

    @field_validator("model")
    @classmethod
    def _model_uri(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"(models|runs):/[^\s/][^\s]*", v):
            raise ValueError("expected an MLflow model URI: models:/NAME/VERSION, models:/NAME@ALIAS or runs:/RUN/PATH")
        return v


class DevicePublic(Reply):
    index: int
    milli: int
    memory_mib: int


class AllocationPublic(Reply):
    member: int
    node: str
    devices: list[DevicePublic]
    state: SeenAllocState
    port: int | None


class EventPublic(Reply):
    at: float
    state: SeenState
    code: str
    """The lifecycle's EventCode: what programs read (the sentence in `reason` is for people)."""
    reason_code: str | None = None
    """For a stop and what follows it: the StopReason (reclaim, preempt, idle, max-runtime, cancel, …)."""
    args: dict[str, Any] = Field(default_factory=dict)
    reason: str


class Suspension(Reply):
    """Why a suspended notebook is not running and how it comes back (gpupool.services.reasons renders `notice`)."""

    reason: str
    """The StopReason that suspended it: preempt, reclaim, consolidate, node-lost, ... (the scheduler's: it resumes
    by itself) or idle, max-runtime (a policy's: held until resumed)."""
    at: float
    """When its processes were gone."""
    by: str | None = None
    """The workload it made room for: named to a victim of the same project only."""
    by_priority: str | None = None
    """That workload's priority class."""
    by_project: str | None = None
    """That workload's project (for a reclaim, the project taking its fair share back)."""
    pool: str | None = None
    """The pool it ran in, where it waits to start again."""
    resumes: str
    """"automatically" (queued again in its old place: it starts when there is room) or "on-resume" (held until
    its owner resumes it)."""
    notice: str
    """The sentence its owner reads in the CLI and the portal: why, when, and when it will be back."""


class WorkloadPublic(Reply):
    id: int
    name: str
    project: str
    owner: str = ""
    """The name of the user who submitted it."""
    type: WorkloadType
    priority: str
    preemptible: bool
    state: SeenState
    reason: str
    """Its current reason, for people; programs read reason_event and reason_code."""
    reason_event: str = "queued"
    """The lifecycle's EventCode of its last step ("queued": waiting, reason_code is the PendingReason)."""
    reason_code: str | None
    reason_args: dict[str, JsonValue] = Field(default_factory=dict)
    """The numbers behind a scheduler reason, by name, in integer units (milli-GPU, millicores, MiB, seconds since
    the epoch) and names: gpupool.core.decision.Pending.args lists them per code. Empty for any other reason.
    Typed as any JSON value so a client reads what a later server adds."""
    reason_short: str = ""
    """A few words of `reason` for a list."""
    node: str | None
    devices: list[int]
    gpu_request: str
    gpus: int
    gpu_milli: int
    gpu_memory_mib: int
    workers: int
    attempt: int
    exit_code: int | None
    gpu_util_pct: int | None = None
    """Sampled utilisation of its GPU share (modelled from CPU activity on simulated GPUs)."""
    max_duration_s: float | None = None
    """Declared at submit: it is stopped once it has run this long."""
    eta: datetime | None = None
    """Queued only: when it is expected to start (the scheduler run forward over the expected ends of running
    work, gpupool.control.estimates); null when none is expected while what holds the room runs on, or before the
    first estimate."""
    eta_basis: Literal["declared", "history", "none"] | None = None
    """What `eta` rests on: declared max durations, runtimes of the project's finished work, or nothing."""
    suspension: Suspension | None = None
    """Suspended only: why and how it comes back. While one the scheduler stopped waits to start again, `reason`
    and `reason_short` are its notice, and reason_code and reason_args still say what it waits for now."""
    created_at: float
    started_at: float | None
    finished_at: float | None
    run: int = 1
    """Its number among the runs of its name in its project (1 the first): a finished name submitted again, applied
    with another spec, or rerun is a new run, the earlier ones its history."""
    runs: int = 1
    """How many runs its name has had (lists show a name once, as its newest run, unless asked for every run)."""


class QueuePosition(Reply):
    """Where a queued workload stands in its project's queue, by priority then submit time (1 is next)."""

    project: int
    project_queued: int


class WorkloadOrigin(Reply):
    """The object a workload was adopted from: a Kubernetes pod that names gpupool as its scheduler, or the owner of a
    gang of them (a Job, a JobSet, a PodGroup, ...)."""

    kind: str
    namespace: str
    name: str
    uid: str
    pods: list[str] = Field(default_factory=list)
    """A gang's pods, by member (empty for a single pod: it is the origin)."""


class WorkloadDetail(WorkloadPublic):
    command: list[str]
    cpu_milli: int = 0
    """CPU per member, in millicores (0: none asked for)."""
    memory_mib: int = 0
    """Host memory per member (0: none asked for)."""
    pools: list[str] = Field(default_factory=list)
    gpu_models: list[str] = Field(default_factory=list)
    clusters: list[str] = Field(default_factory=list)
    on_cluster_lost: ClusterLostPolicyPublic = Field(
        default_factory=lambda: ClusterLostPolicyPublic(action="requeue", after_s=CLUSTER_LOST_AFTER_S)
    )
    image: str | None = None
    volumes: list[VolumeMount] = Field(default_factory=list)
    """The project volumes it mounts, as submitted."""
    env: dict[str, str]
    port: int | None
    grace_s: float
    fraction: Literal["enforced", "advisory"] | None
    """For fractional GPUs: whether the limit is enforced (CUDA MPS) or advisory (environment only)."""
    url: str | None
    """A notebook's or service's stable address on the server (through its authenticating proxy)."""
    isolation: dict[str, str] = Field(default_factory=dict)
    """What the backend enforces between this workload and other tenants, and what is advisory."""
    allocations: list[AllocationPublic]
    events: list[EventPublic]
    gpu_memory_used_mib: int | None = None
    idle_since: float | None = None
    idle_timeout_s: float | None = None
    """The policy that applies to it: suspended (notebooks) or stopped after this long idle."""
    max_runtime_s: float | None = None
    idle_threshold_pct: int | None = None
    position: QueuePosition | None = None
    """Queued workloads only."""
    rightsizing: RightsizingAdvice | None = None
    """Advice from its telemetry where it uses far less than it holds (gpupool.services.rightsizing says the rule)."""
    code: str | None = None
    """The code manifest it runs in (`sha256:<hex>`), or None."""
    code_files: int | None = None
    """How many files (and links) that code tree has."""
    code_bytes: int | None = None
    attempts: list[AttemptPublic] = Field(default_factory=list)
    """Its attempts, the one under way last; `history` holds earlier workloads of its name."""
    history: list[HistoryItem] = Field(default_factory=list)
    origin: WorkloadOrigin | None = None
    """Where it comes from when gpupool did not take its submission: the Kubernetes pod it schedules."""
    mlflow_run_url: str | None = None
    """Its current attempt's run in MLflow's UI, where it is tracked and the run is made."""
    model: str | None = None
    """The MLflow model it serves."""


class Page(Reply, Generic[T]):
    items: list[T]
    next_cursor: str | None = None


class DeviceUsage(Reply):
    index: int
    model: str
    memory_mib: int
    allocated_milli: int
    workloads: list[str]


class NodePublic(Reply):
    name: str
    pool: str
    cluster: str = ""
    """The cluster it belongs to (the hub's own, or a spoke's: gpupool cluster list)."""
    backend: str
    schedulable: bool
    cpu_milli: int
    memory_mib: int
    devices: list[DeviceUsage]


class ShareLine(Reply):
    """A department's or project's standing in one pool, from the last scheduling cycle (GPUs)."""

    queue: str
    kind: Literal["department", "project"]
    parent: str | None
    pool: str
    deserved: float
    fair_share: float
    allocated: float
    limit: float | None
    demand: float
    pending: int


class TimelinePoint(Reply):
    at: float
    allocated_gpus: float
    busy_gpus: float
    by_project: dict[str, list[float]]
    """project → [allocated, busy] GPUs over the minute."""
