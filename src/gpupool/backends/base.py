"""The backend interface: inventory, launch, stop, observe. The control loop is the only caller."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

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


@dataclass(frozen=True, slots=True)
class Capabilities:
    name: str
    fractions_enforced: bool = False
    notebooks: bool = False
    extra: dict[str, str] = field(default_factory=dict)
    isolation: dict[str, str] = field(default_factory=dict)
    """What this backend enforces between tenants (identity, filesystem, processes, apps, cpu_memory), in words;
    'advisory' where it does not."""


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
