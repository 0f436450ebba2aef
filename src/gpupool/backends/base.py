"""The backend interface: inventory, launch, stop, observe. The control loop is the only caller."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from gpupool.core import Node


@dataclass(frozen=True, slots=True)
class DeviceGrant:
    index: int
    milli: int
    memory_mib: int
    model: str
    device_memory_mib: int


@dataclass(frozen=True, slots=True)
class VolumeSpec:
    """A project volume a member mounts: its storage is made at its first mount (idempotently) and kept until the
    volume is deleted."""

    volume_id: int
    project: str
    name: str
    path: str
    """Where the member sees it: absolute."""
    size_bytes: int
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """One member of one attempt of a workload. `alloc_id` keys the launch: launching it twice starts it once."""

    alloc_id: str
    workload_id: int
    workload_name: str
    project: str
    kind: str
    argv: tuple[str, ...]
    env: dict[str, str]
    devices: tuple[DeviceGrant, ...] = ()
    rank: int = 0
    world_size: int = 1
    master_port: int | None = None
    port: int | None = None
    node: str = ""
    attempt: int = 0
    adopted: bool = False
    """Made from objects gpupool did not create (Kubernetes pods, an admitted Job): launched by binding them, never
    as gpupool's own."""
    image: str | None = None
    code: str | None = None
    """The content address (`sha256:<hex>`) of the code tree the member starts in; None: an empty directory."""
    grace_s: float = 30.0
    cpu_milli: int = 0
    memory_mib: int = 0
    project_id: int = 0
    """Keys the member's OS identity where the backend gives each project one."""
    secrets: dict[str, str] = field(default_factory=dict)
    """The project's secrets, as environment variables under `env` (which wins on a clash). Apart from `env` so a
    backend can keep them out of what others read (a Kubernetes Secret rather than the pod spec)."""
    volumes: tuple[VolumeSpec, ...] = ()
    pod_security: str = "restricted"
    """How tightly a pod is confined (kubernetes): "restricted" (a non-root identity of its project's, no
    capabilities) or "baseline" (the image's own user; no privilege escalation). An admin's per-project choice."""
    host_network: bool = False
    """The host's network rather than one of its own (local backend): an admin's per-project grant."""
    init: tuple[str, ...] = ()
    """A command run to its end before `argv`, as the member with its environment and the network even where
    `argv` has none of its own (a model server's download); `argv` starts only if it succeeds."""


class LaunchWaits(RuntimeError):
    """A launch that cannot happen yet and will without anyone's help (an admitted Job's pods are still being
    made): tried again next cycle, and no failure."""


@dataclass(frozen=True, slots=True)
class Observed:
    alloc_id: str
    alive: bool
    exit_code: int | None = None
    """None while alive, or when it vanished without saying (killed, lost)."""
    enforced: bool = False
    """Whether a fractional limit is enforced (MPS) rather than advisory."""
    lost: bool = False
    """Its node went away (deleted, or NotReady too long): not the workload's fault, so it is requeued."""
    reason: str | None = None
    """Why an ended member failed, in the backend's words where it knows them (its environment could not be built,
    its image cannot run here): a few lines, at most 1 KiB, for the failed event's detail."""


@dataclass(frozen=True, slots=True)
class MemberSample:
    """One member's GPU activity since the last sample: utilisation of its share (0-100) and memory in use."""

    util_pct: int
    memory_used_mib: int


@dataclass(frozen=True, slots=True)
class DeviceSample:
    node: str
    index: int
    uuid: str
    model: str
    util_pct: int
    memory_used_mib: int


@dataclass(frozen=True, slots=True)
class Sample:
    members: dict[str, MemberSample]
    devices: tuple[DeviceSample, ...]
    modelled: bool
    """True where activity is modelled from CPU use (simulated GPUs) rather than read from the driver."""


class FilesError(Exception):
    """A workload's files refused or out of reach: the message says why, `status` is the HTTP status it means (a
    path outside or a link on the way 422, absent 404, too large 413, a member that cannot be reached 409)."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class FileEntry:
    path: str
    """Relative to the working directory."""
    kind: Literal["file", "dir", "link", "other"]
    size: int
    mtime: float


@dataclass(frozen=True, slots=True)
class FilesTarget:
    """The member whose working directory `cp` reaches (the API checked who may)."""

    workload_id: int
    workload: str
    project: str
    project_id: int
    rank: int
    alloc_id: str | None
    """Its allocation while it runs; None once it has ended (or before it started)."""


class WorkloadFiles(Protocol):
    """One member's working directory as `cp` reaches it; every path is relative to it. Refusals raise FilesError."""

    def list(self, rel: str) -> list[FileEntry]:
        """The entries of a directory (one level), or the one entry of a file."""

    def read(self, rel: str, max_bytes: int) -> tuple[bytes, bool]:
        """A file's bytes, or a tar of a directory (links as links); and whether it is a tar."""

    def extract(self, rel: str, data: bytes, max_bytes: int) -> tuple[int, int]:
        """A tar's regular files and directories put under `rel`; (files, bytes)."""


class Storage(Protocol):
    """What a backend keeps of workloads beyond their runs (working directories, volumes), as the API and the
    leader's housekeeping reach it: through `Capabilities.storage`, so a backend without any needs none of this."""

    def workload_files(self, target: FilesTarget) -> WorkloadFiles | None:
        """The member's working directory for `cp`; None where it has none (any more). Raises FilesError (409)
        where this backend cannot reach it, saying why (a Kubernetes pod that has ended)."""

    def workdir_collected(self, workload_id: int) -> bool:
        """Whether its working directory was removed at the end of its retention (cp then answers 410)."""

    def workdir_ids(self) -> list[int]:
        """The workloads whose working directories this backend keeps after they end (none on Kubernetes)."""

    def collect_workdir(self, workload_id: int) -> None:
        """Remove a finished workload's working directory once its retention is over (the leader asks)."""

    def discard(self, workload_id: int) -> None:
        """A deleted workload's files go (the API's delete asks; a live workload's are never asked for)."""

    def delete_volume(self, volume: VolumeSpec) -> None:
        """A deleted volume's storage goes (never made, because never mounted, is fine)."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    name: str
    fractions_enforced: bool = False
    notebooks: bool = False
    extra: dict[str, str] = field(default_factory=dict)
    isolation: dict[str, str] = field(default_factory=dict)
    """What this backend enforces between tenants (identity, filesystem, processes, apps, cpu_memory), in words;
    'advisory' where it does not."""
    storage: Storage | None = field(default=None, compare=False, repr=False)
    """Where its workloads' files and volumes are reached (the backend itself, typically); None: it keeps none
    (`cp` answers 409, a deleted volume or workload has nothing to remove, no working directory is collected)."""


@dataclass(frozen=True, slots=True)
class AppEndpoint:
    """Where the server's proxy reaches a notebook or service: a Unix socket, or a host and port."""

    uds: str | None = None
    host: str | None = None
    port: int | None = None


class Backend(Protocol):
    def inventory(self) -> list[Node]: ...

    def capabilities(self) -> Capabilities: ...

    def launch(self, spec: LaunchSpec) -> None:
        """Start the member unless a launch with this alloc_id already exists. Never blocks on the workload."""

    def stop(self, alloc_id: str, force: bool) -> None:
        """Ask it to stop (SIGTERM to the whole member, within the launch's `grace_s`), or force it (SIGKILL). The
        caller keeps the grace clock, and asks again each cycle until the member has ended."""

    def observe(self) -> dict[str, Observed] | None:
        """What runs, and what ended with which exit code, for every launch the backend knows. None while the
        backend's view is not synced (before its first list) or stale: then nothing may be concluded from a
        launch's absence, and the caller leaves every member as it was."""

    def forget(self, alloc_id: str) -> None:
        """Drop the record of an ended launch."""

    def read_log(self, workload_id: int, rank: int, offset: int, limit: int) -> bytes:
        """Up to `limit` bytes of a member's output from `offset` (empty when there is none yet)."""

    def healthy(self, alloc_id: str, port: int | None) -> bool:
        """Whether a notebook or service member answers (on its port, or by its readiness)."""

    def app_endpoint(self, alloc_id: str, port: int | None) -> AppEndpoint | None:
        """Where the server's app proxy reaches a member's notebook or service; None where it cannot."""

    def sample(self) -> Sample:
        """GPU activity per running member and per device, since the previous call."""
