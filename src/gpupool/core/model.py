"""Domain types of the scheduling core: the immutable snapshot a cycle reads.

Every quantity is an integer: GPU in milli-GPU (1 GPU = 1000), GPU memory and host memory in MiB,
CPU in millicores. Times are seconds on the caller's clock; the core never reads a clock itself.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

MILLI = 1000


@dataclass(frozen=True, slots=True)
class Device:
    """One physical GPU of a node."""

    index: int
    model: str
    memory_mib: int


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    pool: str
    cpu_milli: int
    memory_mib: int
    devices: tuple[Device, ...] = ()
    schedulable: bool = True
    """False for cordoned, NotReady or draining nodes: they keep what runs but take no new work."""
    cluster: str = ""
    """The cluster it belongs to (a topology level above nodes): a gang never spans two; empty for a
    single-cluster deployment."""


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """What an admin sets for one pool of nodes."""

    share_across_projects: bool = False
    """Whether fractions of different projects may share one device. The workloads on a device share its
    memory and compute without isolation, so by default a device's shares all belong to one project."""


DEFAULT_POOL = PoolSettings()


@dataclass(frozen=True, slots=True)
class Quota:
    """A queue's quota in one pool: GPU in milli-GPU; CPU (millicores) and memory (MiB) where set."""

    deserved: int = 0
    limit: int | None = None
    """Hard cap on deserved plus over-quota; None is unlimited."""
    over_quota_weight: int = 1
    cpu_deserved: int | None = None
    """CPU guaranteed; where set, non-preemptible work must fit in it. None: not set."""
    cpu_limit: int | None = None
    memory_deserved: int | None = None
    memory_limit: int | None = None


@dataclass(frozen=True, slots=True)
class Queue:
    """A node of the organisation tree: a department (has children) or a project (holds workloads)."""

    name: str
    parent: str | None = None
    quotas: Mapping[str, Quota] = field(default_factory=dict)
    """Per pool. A pool without an entry gives no guarantee, no cap and weight 1."""
    strict_fifo: bool = False
    """When set, a blocked head of the project's queue blocks everything behind it."""

    def quota(self, pool: str) -> Quota:
        return self.quotas.get(pool, _NO_QUOTA)


_NO_QUOTA = Quota()


class GpuKind(enum.Enum):
    NONE = "none"
    WHOLE = "whole"
    FRACTION = "fraction"
    MEMORY = "memory"


@dataclass(frozen=True, slots=True)
class Request:
    """What one member of a workload asks for. Exactly one GPU form is set (or none)."""

    gpus: int = 0
    """Whole GPUs, all on one node."""
    gpu_milli: int = 0
    """A fraction of one device, 1..999."""
    gpu_memory_mib: int = 0
    """An amount of one device's memory; its share is memory / device memory, rounded up."""
    cpu_milli: int = 0
    memory_mib: int = 0

    def __post_init__(self) -> None:
        forms = (self.gpus > 0) + (self.gpu_milli > 0) + (self.gpu_memory_mib > 0)
        if forms > 1:
            raise ValueError("a request names at most one of gpus, gpu_milli and gpu_memory_mib")
        if min(self.gpus, self.gpu_milli, self.gpu_memory_mib, self.cpu_milli, self.memory_mib) < 0:
            raise ValueError("request quantities must not be negative")
        if self.gpu_milli >= MILLI:
            raise ValueError("a fraction is 1..999 milli-GPU; ask for whole gpus instead")

    @property
    def kind(self) -> GpuKind:
        if self.gpus:
            return GpuKind.WHOLE
        if self.gpu_milli:
            return GpuKind.FRACTION
        if self.gpu_memory_mib:
            return GpuKind.MEMORY
        return GpuKind.NONE

    def share_on(self, device_memory_mib: int) -> tuple[int, int]:
        """(milli, memory MiB) this request takes of one device with the given memory (non-whole forms)."""
        if self.gpu_milli:
            return self.gpu_milli, self.gpu_milli * device_memory_mib // MILLI
        if self.gpu_memory_mib:
            milli = -(-self.gpu_memory_mib * MILLI // device_memory_mib)
            return milli, self.gpu_memory_mib
        return 0, 0

    def nominal_milli(self) -> int:
        """GPU milli this request counts for, before a device is chosen (memory requests: at least 1)."""
        if self.gpus:
            return self.gpus * MILLI
        if self.gpu_milli:
            return self.gpu_milli
        return 1 if self.gpu_memory_mib else 0


@dataclass(frozen=True, slots=True)
class DeviceShare:
    index: int
    milli: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one member of a workload runs."""

    member: int
    node: str
    devices: tuple[DeviceShare, ...] = ()


class State(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    RELEASING = "releasing"
    """Evicted or cancelled, still holding its devices until its processes are gone."""


@dataclass(frozen=True, slots=True)
class Workload:
    id: str
    project: str
    request: Request
    priority: int = 50
    priority_class: str = "training"
    preemptible: bool = True
    min_runtime_s: float = 0.0
    gang_size: int = 1
    pools: tuple[str, ...] = ()
    """Acceptable pools in order of preference; empty means any."""
    gpu_models: tuple[str, ...] = ()
    """Acceptable GPU models; empty means any."""
    clusters: tuple[str, ...] = ()
    """Acceptable clusters in order of preference; empty means any."""
    submit_time: float = 0.0
    state: State = State.PENDING
    placements: tuple[Placement, ...] = ()
    start_time: float | None = None
    nominated_nodes: tuple[str, ...] = ()
    """Where the last cycle said it would start once evictions finish: it gets first claim there."""
    checkpoint_time: float | None = None
    """When it last saved a checkpoint: work before it is not lost by an eviction. None: never (or unknown)."""
    label: str = ""
    """How messages name it to people (the product passes its name); empty: its id, as the simulator does."""

    @property
    def shown(self) -> str:
        return self.label or self.id

    def named_for(self, reader: Workload) -> str:
        """How a message about `reader` names this workload: by label within one project, and across projects by
        its project only (a tenant does not learn another's workload names)."""
        return self.shown if self.project == reader.project else f"a workload of project {self.project}"

    def __post_init__(self) -> None:
        if self.gang_size < 1:
            raise ValueError("gang_size must be at least 1")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one scheduling cycle may look at."""

    nodes: tuple[Node, ...]
    queues: tuple[Queue, ...]
    workloads: tuple[Workload, ...]
    now: float = 0.0
    pool_settings: Mapping[str, PoolSettings] = field(default_factory=dict)
    """Per pool. A pool without an entry takes the defaults (its devices are not shared across projects)."""

    def pool(self, name: str) -> PoolSettings:
        return self.pool_settings.get(name, DEFAULT_POOL)
