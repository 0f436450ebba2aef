"""Project volumes and a workload's files, on the wire."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpupool.models.wire import Name, Reply, Wire

VOLUME_PATH = r"^/[A-Za-z0-9._/-]{1,254}$"
"""Where a volume is mounted inside a workload: absolute, of plain characters (checked further at submit)."""


class VolumeMount(Wire):
    """One volume a workload mounts: `--volume NAME:/path[:ro]` on the CLI, `volumes:` in apply's YAML."""

    name: Name
    path: str = Field(pattern=VOLUME_PATH, description="An absolute path inside the workload, like /data.")
    read_only: bool = False


class VolumeCreate(Wire):
    project: Name
    name: Name
    size: str = Field(max_length=32, description="Like 50GiB or 512MiB; at most the server's cap.")


class VolumePublic(Reply):
    id: int
    name: str
    project: str
    size_bytes: int
    created_at: float
    created_by: str
    in_use_by: list[str] = Field(default_factory=list)
    """The live workloads that mount it (a volume in use cannot be deleted)."""


class FileEntry(Reply):
    """One entry of a workload's working directory (`GET .../files?list=1`), its path relative to it."""

    path: str
    kind: Literal["file", "dir", "link", "other"]
    size: int
    mtime: float


class FilesPut(Reply):
    """What an upload put into a workload's working directory."""

    files: int
    bytes: int
