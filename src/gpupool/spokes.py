"""Assembling the backends a server drives from its settings: its own cluster's (local or kubernetes), and the fleet
around it, whose spokes (`gpupool cluster add`) are read from the store and built the same way."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpupool.backends.base import Backend
from gpupool.backends.fleet import Fleet, SpokeConfig
from gpupool.backends.local import LocalBackend
from gpupool.backends.local.gpus import Discovered
from gpupool.backends.local.sandbox import Isolation
from gpupool.models.clusters import ClusterKind
from gpupool.services import code
from gpupool.settings import Settings
from gpupool.store.tables import AllocationRow, ClusterRow, WorkloadRow

Nudge = Callable[[], None]


class NoCodeUrl(ValueError):
    """A Kubernetes cluster needs the server's address for its pods to fetch their code."""


def kube_backend(
    settings: Settings, sessions: sessionmaker[Session], nudge: Nudge, kubeconfig: str | None, pool_label: str
) -> Backend:
    from gpupool.backends.kubernetes.backend import NO_CODE_URL, SERVER_IMAGE, KubernetesBackend, KubeSettings

    code_url = settings.code_url or settings.public_url
    if code_url is None:
        raise NoCodeUrl(NO_CODE_URL)
    kube = KubeSettings(
        kubeconfig, pool_label, settings.namespace_prefix, settings.default_image,
        uid_base=settings.uid_base, code_url=code_url, code_image=settings.code_image or SERVER_IMAGE,
        scheduler_name=settings.scheduler_name,
    )  # fmt: skip

    def code_token(workload_id: int) -> str:
        with sessions() as s:
            row = s.get(WorkloadRow, workload_id)
            if row is None:
                raise LookupError(f"workload {workload_id} is gone")
            return code.mint_token(s, row)

    return KubernetesBackend(kube, on_change=nudge, code_token=code_token)


def local_backend(
    settings: Settings, data_dir: Path, gpus: Discovered, nudge: Nudge, isolation: Isolation, adopt: bool
) -> Backend:
    # Replicas on one host share the data dir's run records: one that does not lead must leave them alone
    # (adopting sweeps half-made launches, which the leader may be making); it adopts when it takes over.
    return LocalBackend(
        data_dir, settings.node_name or socket.gethostname(), settings.pool, gpus,
        on_exit=nudge, isolation=isolation, uid_base=settings.uid_base, adopt=adopt, pids_limit=settings.pids_limit,
        api_port=settings.port or None,
    )  # fmt: skip


def fleet(
    settings: Settings,
    home: Backend,
    sessions: sessionmaker[Session],
    nudge: Nudge,
    local: Callable[[Path], Backend],
) -> Fleet:
    """The hub's own backend and its spokes. `local(data_dir)`: this host's backend, for a spoke added `--local`."""
    spokes_dir = settings.data_dir / "clusters"

    def load() -> list[SpokeConfig]:
        with sessions() as s:
            return [
                SpokeConfig(r.name, r.kind, r.kubeconfig, r.pool_label, r.pool_scope, r.draining)
                for r in s.scalars(select(ClusterRow).order_by(ClusterRow.name))
            ]

    def build(config: SpokeConfig) -> Backend:
        spokes_dir.mkdir(mode=0o700, exist_ok=True)
        if config.kind == ClusterKind.LOCAL:
            return local(spokes_dir / config.name)
        path = spokes_dir / f"{config.name}.kubeconfig"  # the client reads a file; only this server's user may
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(config.kubeconfig or "")
        return kube_backend(settings, sessions, nudge, str(path), config.pool_label or settings.pool_label)

    def locate_alloc(alloc_id: str) -> str | None:
        with sessions() as s:
            return s.scalar(select(AllocationRow.node).where(AllocationRow.id == alloc_id))

    def locate_workload(workload_id: int, rank: int) -> str | None:
        with sessions() as s:
            return s.scalar(
                select(AllocationRow.node)
                .where(AllocationRow.workload_id == workload_id, AllocationRow.member == rank)
                .order_by(AllocationRow.attempt.desc())
                .limit(1)
            )

    return Fleet(
        home, settings.cluster_name, load, build, locate_alloc=locate_alloc, locate_workload=locate_workload,
        heartbeat_s=settings.cluster_heartbeat_s, on_change=nudge,
    )  # fmt: skip
