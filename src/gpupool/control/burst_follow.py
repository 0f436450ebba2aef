"""Burst nodes followed with their providers: asks made, requests provisioned turned into nodes, capacity given back.

Each call to a provider is idempotent by the request's name, and each row's phase says what may still be owed: a
row `asking` is asked for (again), one `releasing` given back (again). The phase moves on only once the provider
has answered, so a crash in between repeats the call, never skips it. Requests in the provider's namespace that no
open row names (a store restored from an older backup, a row given back whose delete was lost) are given back."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping

from gpupool.backends.fleet import SEP
from gpupool.backends.kubernetes.provisioning import BurstProvider, Provisioner, ProvisioningState, pod_template
from gpupool.failpoints import failpoint
from gpupool.lifecycle import burst as burst_lifecycle
from gpupool.lifecycle.phases import OPEN, BurstEnd, BurstPhase
from gpupool.models.clusters import ClusterKind
from gpupool.store.tables import BurstNodeRow, ClusterRow

log = logging.getLogger("gpupool.burst")

TEMPLATE_CPU_MILLI = 1000
TEMPLATE_MEMORY_MIB = 1024
"""A request's pod asks for a whole node's GPUs and little else, so any node of the size asked for holds it."""


def kube_provider(row: ClusterRow) -> BurstProvider | None:
    """A Kubernetes cluster's ProvisioningRequests, reached with its kubeconfig; None for a host."""
    if row.kind != ClusterKind.KUBERNETES or not row.kubeconfig:
        return None
    import yaml

    from kubernetes import config as kube_config  # an extra: a hub without it has no Kubernetes spoke to ask

    return Provisioner(kube_config.new_client_from_config_dict(yaml.safe_load(row.kubeconfig)))  # type: ignore[no-untyped-call]


class BurstFollow:
    def __init__(self, providers: Callable[[ClusterRow], BurstProvider | None] = kube_provider) -> None:
        self._build = providers
        self._providers: dict[str, tuple[str, BurstProvider | None]] = {}

    def provider(self, c: ClusterRow) -> BurstProvider | None:
        """The cluster's provider, built again when its credentials change."""
        key = hashlib.sha256(f"{c.kind}\0{c.kubeconfig or ''}".encode()).hexdigest()
        cached = self._providers.get(c.name)
        if cached is None or cached[0] != key:
            cached = (key, self._build(c))
            self._providers[c.name] = cached
        return cached[1]

    def follow(
        self,
        rows: list[BurstNodeRow],
        clusters: Mapping[str, ClusterRow],
        reached: Callable[[str], bool],
        seen: Mapping[str, bool],
        now: float,
    ) -> None:
        """Bring open rows up to date with their providers. `seen`: the burst clusters' nodes in the last snapshot
        (hub names), and whether each takes work as its cluster offers it."""
        by_cluster: dict[str, list[BurstNodeRow]] = {}
        for row in rows:
            by_cluster.setdefault(row.cluster, []).append(row)
        for name in sorted(set(by_cluster) | {n for n, c in clusters.items() if c.burst}):
            mine = by_cluster.get(name, [])
            c = clusters.get(name)
            provider = None if c is None else self.provider(c)
            if provider is None:
                _abandon(mine, now)
                continue
            if not reached(name):
                continue
            try:
                self._follow(provider, name, mine, c is not None and c.burst is not None, seen, now)
            except Exception as e:  # tried again next step: every call is idempotent
                log.warning("burst cluster %s: %s", name, " ".join(str(e).split())[:300])

    def _follow(
        self,
        provider: BurstProvider,
        cluster: str,
        rows: list[BurstNodeRow],
        bursting: bool,
        seen: Mapping[str, bool],
        now: float,
    ) -> None:
        listed = provider.list()
        known = {r.name for r in rows}
        for orphan in sorted(set(listed) - known):
            log.warning("burst cluster %s: giving back request %s, which no open burst node names", cluster, orphan)
            provider.give_back(orphan)
        taken = {r.node for r in rows if r.node}
        free = sorted(
            n for n, works in seen.items() if works and n not in taken and n.startswith(f"{cluster}{SEP}")
        )  # attributed in name order: any node of the size asked for is as good as another
        for row in sorted(rows, key=lambda r: (r.asked_at, r.name)):
            phase = burst_lifecycle.phase(row)
            if phase in (BurstPhase.PROVISIONING, BurstPhase.READY) and not bursting:
                burst_lifecycle.release(row, BurstEnd.UNWANTED, "the cluster no longer bursts")
                continue
            if phase is BurstPhase.ASKING:
                self._ask(provider, row)
            elif phase is BurstPhase.PROVISIONING:
                got = listed.get(row.name)
                if got is None:
                    burst_lifecycle.release(row, BurstEnd.LOST, "its request was deleted in the cluster")
                elif got.state is ProvisioningState.FAILED:
                    burst_lifecycle.release(row, BurstEnd.FAILED, got.message or "provisioning failed")
                elif got.state is ProvisioningState.CAPACITY_REVOKED:
                    burst_lifecycle.release(row, BurstEnd.REVOKED, got.message or "capacity revoked")
                elif got.state is not ProvisioningState.PENDING and free:
                    node = free.pop(0)
                    provider.claim(row.name, node.split(SEP, 1)[1])
                    burst_lifecycle.ready(row, node, now)
                    log.info("burst node %s of %s is %s", row.name, row.department, node)
            elif phase is BurstPhase.READY:
                got = listed.get(row.name)
                if row.node not in seen:
                    burst_lifecycle.release(row, BurstEnd.LOST, "its node left the cluster")
                elif got is None or got.state is ProvisioningState.CAPACITY_REVOKED:
                    burst_lifecycle.release(row, BurstEnd.REVOKED, "its request was revoked or deleted")
        self._act(provider, rows, now)

    def act(
        self,
        rows: Iterable[BurstNodeRow],
        clusters: Mapping[str, ClusterRow],
        reached: Callable[[str], bool],
        now: float,
    ) -> None:
        """Make the asks and give-backs the rows' phases owe (after their intents were committed)."""
        by_cluster: dict[str, list[BurstNodeRow]] = {}
        for row in rows:
            by_cluster.setdefault(row.cluster, []).append(row)
        for name, mine in sorted(by_cluster.items()):
            c = clusters.get(name)
            provider = None if c is None else self.provider(c)
            if provider is not None and reached(name):
                self._act(provider, mine, now)

    def _act(self, provider: BurstProvider, rows: Iterable[BurstNodeRow], now: float) -> None:
        for row in rows:
            phase = burst_lifecycle.phase(row)
            try:
                if phase is BurstPhase.ASKING:
                    self._ask(provider, row)
                elif phase is BurstPhase.RELEASING:
                    provider.give_back(row.name, row.node.split(SEP, 1)[1] if row.node else None)
                    failpoint("burst.after-give-back")
                    burst_lifecycle.released(row, now)
            except Exception as e:  # tried again next step: every call is idempotent
                log.warning("burst node %s: %s", row.name, " ".join(str(e).split())[:300])

    def _ask(self, provider: BurstProvider, row: BurstNodeRow) -> None:
        template = pod_template(row.name, row.gpus, TEMPLATE_CPU_MILLI, TEMPLATE_MEMORY_MIB)
        provider.ask(row.name, 1, row.department, template)
        failpoint("burst.after-ask")
        burst_lifecycle.asked(row)


def _abandon(rows: list[BurstNodeRow], now: float) -> None:
    """Rows of a cluster removed (or without a provider): nothing is left to give back to; their bills end."""
    for row in rows:
        if burst_lifecycle.phase(row) in OPEN - {BurstPhase.RELEASING}:
            burst_lifecycle.release(row, BurstEnd.UNWANTED, "its cluster was removed")
        burst_lifecycle.released(row, now)
