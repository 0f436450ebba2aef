"""One validated Settings object, built by an entry point (the server command, a test) and passed down."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gpupool"


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    data_dir: Path = Field(default_factory=default_data_dir)
    db_url: str | None = None
    """SQLAlchemy URL; None: SQLite in data_dir."""
    host: str = "127.0.0.1"
    port: int = Field(8470, ge=0, le=65535)
    backend: Literal["local", "kubernetes"] = "local"
    kubeconfig: str | None = None
    """For the kubernetes backend; None: the in-cluster configuration."""
    pool_label: str = "gpupool.io/pool"
    """The node label whose value names a node's pool (kubernetes)."""
    namespace_prefix: str = "gpupool-"
    default_image: str = "python:3.12-slim"
    gpus: str = "auto"
    """'auto' (NVML, else simulated), 'nvml', or 'fake:<count>x<model>-<memory GB>[,...]'."""
    pool: str = "default"
    node_name: str | None = None
    interval_s: float = Field(2.0, gt=0)
    """The loop also runs on every submit, cancel and process exit; this is the longest it waits."""
    grace_s: float = Field(30.0, ge=0)
    """Default time between SIGTERM and SIGKILL when a workload is evicted or cancelled."""
    telemetry_interval_s: float = Field(5.0, gt=0)
    """How often GPU activity is sampled and usage charged."""
    prices: dict[str, float] = Field(default_factory=dict)
    """Price of one GPU-hour per pool, for cost reports (a pool without one costs 0)."""
    min_runtime_s: dict[str, float] | None = None
    """Per priority class, overriding the class defaults (e.g. {'training': 0})."""
    single_user: bool = False
    """Run every local workload as the server's own user, with no isolation between tenants. Without it the
    server refuses to start where it cannot give each project an OS identity of its own."""
    uid_base: int = Field(1_900_000_000, ge=100_000, le=2**31 - 2**24)
    """Project p's workloads run as uid uid_base + p (local backend, not single-user)."""
    public_url: str | None = Field(None, max_length=512, pattern=r"^https?://[^\s/?#]+/?$")
    """How users reach this server (for app URLs); None: http://host:port."""

    @property
    def public_base_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{self.data_dir / 'gpupool.db'}"
