"""The rows of gpupool's store. Only `gpupool.store` speaks SQL; other layers get domain objects or wire models."""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    event,
    false,
    true,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, UOWTransaction, mapped_column, relationship
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class QueueRow(Base):
    """A department (kind='department') or a project (kind='project') of the organisation tree."""

    __tablename__ = "queues"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    kind: Mapped[str] = mapped_column(String(16))
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("queues.id"), nullable=True)
    strict_fifo: Mapped[bool] = mapped_column(Boolean, default=False)
    production_allowed: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """Whether its members may submit at production priority (admins and its department admins always may)."""
    pod_security: Mapped[str] = mapped_column(String(16), default="restricted", server_default="restricted")
    """How its Kubernetes pods run: 'restricted' (non-root, no privilege escalation, no capabilities) unless an
    admin allows 'baseline'."""
    host_network: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """Its local workloads share the host's network rather than each having one of its own (an admin's grant)."""
    policy: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    """Idle and runtime limits: {"idle_timeout": {type: s}, "max_runtime": {type: s}, "idle_threshold_pct": n}."""
    burst_after_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    """A department's: burst capacity is asked for its work once that work has waited this long; None: never."""
    burst_budget_micro: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """A department's monthly burst budget, in micro-dollars; None: it never bursts (a budget must be set)."""
    mlflow_uri: Mapped[str | None] = mapped_column(String(512), nullable=True)
    """A project's MLflow tracking server: its workloads get a run there, tagged with who and what ran."""
    burst_paced: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    """Whether the monthly budget accrues evenly over the month (asks are checked against what has accrued so far,
    so a busy first day cannot spend the month) or is all there from its first day."""
    burst_stop_at_budget: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    """Whether work on the department's burst nodes is stopped (requeued) once its spending reaches the budget;
    False: it runs to its end, and spending may pass the budget by that tail."""
    burst_refused: Mapped[str | None] = mapped_column(String(16), nullable=True)
    """Why the department's waiting work got no burst node at the hub's last try (gpupool.core.burst: over-budget or
    pools-full); None when it got what it needed or needed nothing."""
    burst_refused_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    quotas: Mapped[list[QuotaRow]] = relationship(cascade="all, delete-orphan", lazy="selectin")


class QuotaRow(Base):
    __tablename__ = "quotas"
    queue_id: Mapped[int] = mapped_column(ForeignKey("queues.id"), primary_key=True)
    pool: Mapped[str] = mapped_column(String(63), primary_key=True)
    deserved_milli: Mapped[int] = mapped_column(BigInteger, default=0)
    limit_milli: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    weight: Mapped[int] = mapped_column(Integer, default=1)


class UserRow(Base):
    """A person (kind 'person', signing in with a password or through an identity provider) or a project's
    service account (kind 'service', reached only with its tokens)."""

    __tablename__ = "users"
    __table_args__ = (UniqueConstraint("issuer", "subject", name="uq_user_identity"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    """'admin' for the platform's admins; otherwise the role new memberships default to (member, viewer)."""
    kind: Mapped[str] = mapped_column(String(16), default="person", server_default="person")
    password_hash: Mapped[str | None] = mapped_column(String(255), nullable=True)
    issuer: Mapped[str | None] = mapped_column(String(255), nullable=True)
    """For single sign-on: the identity provider and the subject it names the user by (never the email)."""
    subject: Mapped[str | None] = mapped_column(String(255), nullable=True)
    email: Mapped[str | None] = mapped_column(String(255), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    disabled_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Offboarded: no token, session or sign-in of its works; enabling it again restores them (a deleted one never)."""
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Deleted: disabled for good, out of its projects and of the user list; its name stays in history and reports."""


class MembershipRow(Base):
    """A role on a queue: member or viewer of a project, or admin of a department (its projects, their quotas
    within its budget, their policies and memberships)."""

    __tablename__ = "memberships"
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("queues.id"), primary_key=True)
    """The queue: a project, or a department for a department admin."""
    role: Mapped[str] = mapped_column(String(16), default="member", server_default="member")


class TokenRow(Base):
    """A credential, stored as its SHA-256 only: a personal or service token for the API, a portal session, or
    an API key for one inference service. A token never has more rights than its user has now; `project_id`
    and `role` narrow them further."""

    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    """personal, service, session or apikey."""
    name: Mapped[str] = mapped_column(String(63))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    project_id: Mapped[int | None] = mapped_column(ForeignKey("queues.id"), nullable=True)
    role: Mapped[str | None] = mapped_column(String(16), nullable=True)
    """The most it may do (viewer, member); None: what its user may."""
    app: Mapped[str | None] = mapped_column(String(63), nullable=True)
    """For an API key: the inference service (workload name in project_id) it opens."""
    created_by: Mapped[int | None] = mapped_column(ForeignKey("users.id"), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_used_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class SecretRow(Base):
    """A project's secret, given to every workload of the project as an environment variable and never shown
    back through the API. Readable by the server's store, as the rest of it is."""

    __tablename__ = "secrets"
    project_id: Mapped[int] = mapped_column(ForeignKey("queues.id"), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[float] = mapped_column(Float)
    updated_by: Mapped[str] = mapped_column(String(63))


class VolumeRow(Base):
    """A project's volume: storage of a set size that outlives workloads, mounted by those that name it (a loop-mounted
    filesystem image on the local backend, a PersistentVolumeClaim on Kubernetes, made at its first mount)."""

    __tablename__ = "volumes"
    __table_args__ = (UniqueConstraint("project_id", "name", name="uq_volumes_project_name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("queues.id"), index=True)
    name: Mapped[str] = mapped_column(String(63))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(63))


class AuditRow(Base):
    """One mutating request or sign-in, whatever its outcome."""

    __tablename__ = "audit"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    request_id: Mapped[str] = mapped_column(String(36))
    actor: Mapped[str | None] = mapped_column(String(63), nullable=True)
    """The authenticated caller, or the name a sign-in was attempted for (cut to 63 characters)."""
    role: Mapped[str | None] = mapped_column(String(16), nullable=True)
    tenant: Mapped[str | None] = mapped_column(String(63), nullable=True, index=True)
    """The project or department the object belongs to, where known."""
    department: Mapped[str | None] = mapped_column(String(63), nullable=True, index=True)
    obj: Mapped[str] = mapped_column(String(255))
    action: Mapped[str] = mapped_column(String(96))
    status: Mapped[int] = mapped_column(Integer)
    address: Mapped[str | None] = mapped_column(String(64), nullable=True)


class NodeRow(Base):
    """A node as its backend reported it; devices is a list of {index, model, memory_mib, uuid}."""

    __tablename__ = "nodes"
    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    backend: Mapped[str] = mapped_column(String(32))
    pool: Mapped[str] = mapped_column(String(63))
    cpu_milli: Mapped[int] = mapped_column(BigInteger)
    memory_mib: Mapped[int] = mapped_column(BigInteger)
    schedulable: Mapped[bool] = mapped_column(Boolean, default=True)
    devices: Mapped[list[Any]] = mapped_column(JSON, default=list)
    updated_at: Mapped[float] = mapped_column(Float)
    cluster: Mapped[str] = mapped_column(String(63), default="", server_default="")
    """The cluster it belongs to: the hub's own (its name from the settings) or a spoke's (its nodes are named
    `<cluster>/<node>`)."""


class ClusterRow(Base):
    """A spoke: a cluster (or host) whose nodes the hub schedules besides its own. The kubeconfig is a secret: kept
    here as project secrets are, and never shown back through the API."""

    __tablename__ = "clusters"
    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    """A ClusterKind: kubernetes (reached with its kubeconfig) or local (this host)."""
    kubeconfig: Mapped[str | None] = mapped_column(Text, nullable=True)
    pool_label: Mapped[str | None] = mapped_column(String(253), nullable=True)
    """The node label that names a node's pool (the hub's default where None)."""
    pool_scope: Mapped[str] = mapped_column(String(16), default="global", server_default="global")
    """A PoolScope: "global" (its pools are the fleet's, and so are their quotas) or "cluster" (its pools are named
    `<cluster>-<pool>`, with quotas of their own)."""
    draining: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """Set by an admin: takes no new work; what runs there runs on."""
    burst: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """For capacity rented on demand (gpupool.models.clusters.BurstSettings: price per GPU-hour in micro-dollars,
    provisioning delay, most GPUs, GPUs per node, idle time before release); None: its nodes are its own."""
    status: Mapped[str] = mapped_column(String(16), default="unknown", server_default="unknown")
    """A ClusterStatus, from its heartbeats: unknown (never reached yet), up or down."""
    last_seen_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    down_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class BurstNodeRow(Base):
    """One node rented for a department from a burst cluster: one ProvisioningRequest of one node, named `name`.
    Written (phase asking) and committed before the request is made, so a crash of the hub neither loses a request
    nor makes two: the name keys the ask, and asking again is idempotent."""

    __tablename__ = "burst_nodes"
    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    cluster: Mapped[str] = mapped_column(String(63), index=True)
    department: Mapped[str] = mapped_column(String(63), index=True)
    """The department that asked for it and pays for it (a top-level queue's name)."""
    gpus: Mapped[int] = mapped_column(Integer)
    price_micro: Mapped[int] = mapped_column(BigInteger)
    """Micro-dollars per GPU-hour, as the cluster's price was at the ask: a later price change bills new nodes."""
    phase: Mapped[str] = mapped_column(String(16), index=True)
    """A BurstPhase (gpupool.lifecycle.burst), changed only by its transition functions."""
    end_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)
    """A BurstEnd: why it is given back."""
    node: Mapped[str | None] = mapped_column(String(253), nullable=True)
    """The hub's name of the node it became (`<cluster>/<node>`), once one is attributed to it."""
    for_workloads: Mapped[list[Any]] = mapped_column(JSON, default=list)
    """The waiting workloads it was asked for (ids), oldest first."""
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    """The provider's last word on it (a failure's reason)."""
    asked_at: Mapped[float] = mapped_column(Float)
    """Billing starts here (clouds bill an instance from when it exists, ready or not)."""
    ready_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    idle_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    """When it last became empty; None while it runs work or is not ready."""
    released_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """When the provider confirmed it given back: billing ends here."""


class SweepRow(Base):
    """A hyperparameter sweep: its spec, and where its Optuna study is (`study`, in Optuna's own tables). Each trial
    is a workload submitted with the idempotency key `sweep:<id>:<trial number>`, so a trial asked for is
    submitted once, whatever crashes in between."""

    __tablename__ = "sweeps"
    __table_args__ = (UniqueConstraint("project_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(63))
    project_id: Mapped[int] = mapped_column(ForeignKey("queues.id"))
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    study: Mapped[str] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(16), index=True)
    """A SweepState."""
    created_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class PoolRow(Base):
    """What an admin set for a pool. Nodes name their pool; a pool without a row has the defaults."""

    __tablename__ = "pools"
    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    share_across_projects: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """Whether fractions of different projects may share a device (their memory and compute are not isolated)."""
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class WorkloadRow(Base):
    __tablename__ = "workloads"
    __table_args__ = (
        # Names are unique among a project's live workloads only: live_name is NULL once one has finished (or
        # was replaced), and NULLs never clash, on SQLite and PostgreSQL alike.
        UniqueConstraint("project_id", "live_name", name="uq_workload_live_name"),
        Index("ix_workloads_project_name", "project_id", "name"),
        UniqueConstraint("owner_id", "idempotency_key", name="uq_workload_idempotency"),
        # Lists page by id within a project or a state (keyset pagination).
        Index("ix_workloads_project_id_id", "project_id", "id"),
        Index("ix_workloads_state_id", "state", "id"),
        Index("ix_workloads_owner_id", "owner_id", "id"),
        # A queued workload's place in its project's queue is counted from this index alone (describe).
        Index("ix_workloads_queue_order", "project_id", "state", "hold", "priority", "queued_at", "id"),
        Index("uq_workloads_origin_uid", "origin_uid", unique=True),
    )
    __mapper_args__ = {"eager_defaults": True}  # noqa: RUF012 - read once, by the mapper
    """A write reads its new version back in the same statement (RETURNING)."""
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    version: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0", index=True)
    """Stamped by every write through the ORM (see next_version and gpupool.store.changes): what the scheduler
    reads again, and what a writer checks nobody wrote since it read."""
    name: Mapped[str] = mapped_column(String(63))
    live_name: Mapped[str | None] = mapped_column(String(63), nullable=True)
    """Its name while it lives (lifecycle sets and clears it); None once finished or replaced."""
    project_id: Mapped[int] = mapped_column(ForeignKey("queues.id"))
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    idempotency_key: Mapped[str | None] = mapped_column(String(128), nullable=True)
    type: Mapped[str] = mapped_column(String(16))
    priority_class: Mapped[str] = mapped_column(String(32))
    priority: Mapped[int] = mapped_column(Integer)
    preemptible: Mapped[bool] = mapped_column(Boolean)
    min_runtime_s: Mapped[float] = mapped_column(Float, default=0.0)
    max_duration_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Declared by its submitter: stopped (with its grace period) once it has run this long; forecasts of when
    queued work starts take it as this workload's end."""
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    gpu_milli: Mapped[int] = mapped_column(Integer, default=0)
    gpu_memory_mib: Mapped[int] = mapped_column(BigInteger, default=0)
    cpu_milli: Mapped[int] = mapped_column(BigInteger, default=0)
    memory_mib: Mapped[int] = mapped_column(BigInteger, default=0)
    workers: Mapped[int] = mapped_column(Integer, default=1)
    pools: Mapped[list[Any]] = mapped_column(JSON, default=list)
    clusters: Mapped[list[Any]] = mapped_column(JSON, default=list, server_default="[]")
    """Clusters it accepts, in order of preference (any where empty)."""
    cluster_lost_after_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Its policy when its cluster goes down: requeued elsewhere once the cluster has been down this long; None:
    it waits for the cluster to come back."""
    gpu_models: Mapped[list[Any]] = mapped_column(JSON, default=list, server_default="[]")
    """GPU models it accepts (any where empty), as nodes name them."""
    command: Mapped[list[Any]] = mapped_column(JSON, default=list)
    image: Mapped[str | None] = mapped_column(String(512), nullable=True)
    """Container image, for backends that run containers (kubernetes); the local backend runs on the host."""
    code: Mapped[str | None] = mapped_column(String(71), nullable=True, index=True)
    """The code it runs in (`sha256:<hex>` of a code manifest its project uploaded), copied into its working
    directory before it starts; None: it starts in an empty one."""
    env: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    spec: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """What was submitted (the WorkloadCreate, name and project aside): what `rerun` submits again."""
    spec_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """SHA-256 of `spec` as canonical JSON: what `apply` compares."""
    retry: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """Its retry policy: {on, max_retries, backoff_s}; None: never retried."""
    retry_at: Mapped[float | None] = mapped_column(Float, nullable=True, index=True)
    """A retry's backoff ends then (it is held until); None otherwise."""
    attempts: Mapped[list[Any]] = mapped_column(JSON, default=list, server_default="[]")
    """Its ended attempts: [{number (from 1), started, ended, outcome, reason, exit_code, retried}]."""
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Deleted by its project (finished; its files removed): gone from lists and look-ups, kept for usage."""
    port: Mapped[int | None] = mapped_column(Integer, nullable=True)
    grace_s: Mapped[float] = mapped_column(Float)
    app_token: Mapped[str | None] = mapped_column(String(64), nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    origin: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """Where a workload gpupool did not submit comes from: {kind: "Pod", namespace, name, uid} for a Kubernetes pod
    that names gpupool as its scheduler, {kind: "Job" | "JobSet" | "PodGroup" | ..., namespace, name, uid, pods}
    for a gang of them (its pods in workload_pods); None for what was submitted to gpupool."""
    mlflow: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """Its MLflow tracking server (`uri`, from the workload or its project at submit), and the run of its current
    attempt there once made (`run_id`, `experiment_id`, `attempt`); None: it is not tracked."""
    origin_uid: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """A single pod's uid: one workload per pod, however often the pods are listed again (None for a gang, whose
    owner makes a new gang each time it replaces its pods)."""
    reason_event: Mapped[str] = mapped_column(String(32), default="queued", server_default="queued")
    """Its current reason: the lifecycle's EventCode of its last step (or "queued" with the scheduler's reason),
    the StopReason or PendingReason, and their arguments. The sentence is rendered from them at the edge."""
    reason_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    reason_args: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    nominated: Mapped[list[Any]] = mapped_column(JSON, default=list)
    stop_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    """Why its processes are being stopped (a lifecycle StopReason); None while nothing asked them to."""
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    hold: Mapped[bool] = mapped_column(Boolean, default=False)
    """Suspended by a policy: not queued again until someone resumes it."""
    gpu_util_pct: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """Last sampled GPU utilisation of its share (0-100)."""
    gpu_memory_used_mib: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    gpu_memory_peak_mib: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """The most GPU memory one member was seen to use, over every sample of its life (what a per-worker request
    must hold): right-sizing advice reads it (gpupool.services.rightsizing)."""
    gpu_util_peak_pct: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """The highest sampled utilisation of its whole grant (0-100): how many of several GPUs it ever kept busy."""
    idle_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    eta: Mapped[float | None] = mapped_column(Float, nullable=True)
    """A queued workload's estimated start (unix seconds; None: none while what holds the room runs on), written
    by gpupool.control.estimates without a version stamp, like a waiting reason."""
    eta_basis: Mapped[str | None] = mapped_column(String(16), nullable=True)
    """What the estimate rests on: "declared" (max durations), "history" (runtimes seen) or "none"."""
    created_at: Mapped[float] = mapped_column(Float)
    queued_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    allocations: Mapped[list[AllocationRow]] = relationship(
        cascade="all, delete-orphan", lazy="selectin", order_by="AllocationRow.member"
    )


class AllocationRow(Base):
    """One member of one attempt of a workload on a node. Its id keys the launch, so a retry never starts a
    second copy."""

    __tablename__ = "allocations"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    member: Mapped[int] = mapped_column(Integer)
    node: Mapped[str] = mapped_column(String(253))
    devices: Mapped[list[Any]] = mapped_column(JSON, default=list)
    """[{index, milli, memory_mib}]"""
    state: Mapped[str] = mapped_column(String(16))
    """A lifecycle AllocPhase: bound (persisted, not launched), launched, ready, ended."""
    port: Mapped[int | None] = mapped_column(Integer, nullable=True)
    master_port: Mapped[int | None] = mapped_column(Integer, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    stop_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    enforced: Mapped[bool] = mapped_column(Boolean, default=False)
    """A fractional limit enforced by the backend (CUDA MPS) rather than advisory."""
    created_at: Mapped[float] = mapped_column(Float)
    abandoned_at: Mapped[float | None] = mapped_column(Float, nullable=True, index=True)
    """Ended by the hub while its cluster was down (its workload was requeued elsewhere): it may still run there.
    Cleared once its cluster, reached again, shows it gone (stopped by the hub if it was not)."""


class WorkloadPodRow(Base):
    """A Kubernetes pod gpupool did not make that is one member of an adopted workload: a pod is adopted once,
    however often the pods are listed again or by whichever server leads."""

    __tablename__ = "workload_pods"
    pod_uid: Mapped[str] = mapped_column(String(64), primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"), index=True)
    member: Mapped[int] = mapped_column(Integer)


class EventRow(Base):
    """One step of a workload's lifecycle: the phase it left it in, the lifecycle's EventCode, the StopReason (for
    stops and what follows them) and the arguments its sentence is rendered from."""

    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"), index=True)
    at: Mapped[float] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(16))
    code: Mapped[str] = mapped_column(String(32), index=True)
    reason_code: Mapped[str | None] = mapped_column(String(32), nullable=True)
    args: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class CodeBlobRow(Base):
    """A blob of code (a chunk of a file, or a manifest) that a project uploaded: the bytes live in the blob area
    (gpupool.store.blobs), shared by content; this row is what lets the project use them. A project that never
    sent a blob's bytes is told the server lacks it, so the store never says what another project uploaded."""

    __tablename__ = "code_blobs"
    project_id: Mapped[int] = mapped_column(ForeignKey("queues.id"), primary_key=True)
    digest: Mapped[str] = mapped_column(String(71), primary_key=True, index=True)
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[float] = mapped_column(Float)


class CodeManifestRow(Base):
    """A code tree a project uploaded: its manifest (a blob of its own) lists each file's path, mode, SHA-256,
    size and chunks. Workloads name it in `code`; one no workload names is collected after a grace period."""

    __tablename__ = "code_manifests"
    project_id: Mapped[int] = mapped_column(ForeignKey("queues.id"), primary_key=True)
    digest: Mapped[str] = mapped_column(String(71), primary_key=True)
    files: Mapped[int] = mapped_column(Integer)
    size: Mapped[int] = mapped_column(BigInteger)
    chunks: Mapped[list[Any]] = mapped_column(JSON, default=list)
    """The digests of every blob it needs (its files' chunks), which it keeps from collection."""
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(63))


class UsageRow(Base):
    """What a workload held and used in one minute: milli-GPU-seconds allocated, and the busy part of them."""

    __tablename__ = "usage"
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"), primary_key=True)
    minute: Mapped[int] = mapped_column(BigInteger, primary_key=True, index=True)
    pool: Mapped[str] = mapped_column(String(63))
    milli_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    busy_milli_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    gpu_memory_mib: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """The most GPU memory its members used together in a sample of that minute; None before one was taken."""
    burst_price_micro: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """Where it ran on a rented (burst) node: that node's price per GPU-hour in micro-dollars; None: on-premises."""


class next_version(FunctionElement[int]):
    """The version a write stamps on a workload row: it grows in commit order, as readers see commits."""

    type = BigInteger()
    inherit_cache = True


@compiles(next_version, "postgresql")
def _next_version_pg(_element: next_version, _compiler: SQLCompiler, **_kw: Any) -> str:
    # The writing transaction's id: a reader's snapshot xmin bounds every write it cannot see yet.
    return "txid_current()"


@compiles(next_version)
def _next_version(_element: next_version, _compiler: SQLCompiler, **_kw: Any) -> str:
    # The write holds SQLite's one write lock from this statement to its commit, so no later commit stamps less.
    return "(SELECT coalesce(max(version), 0) + 1 FROM workloads)"


@event.listens_for(Session, "before_flush")
def _stamp(session: Session, _flush: UOWTransaction, _instances: object) -> None:
    for row in session.new:
        if isinstance(row, WorkloadRow):
            row.version = next_version()
    for row in session.dirty:
        if isinstance(row, WorkloadRow) and session.is_modified(row, include_collections=False):
            row.version = next_version()
