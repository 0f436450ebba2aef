"""The hub's backend: its own cluster (the backend its settings choose) and its spokes (clusters and hosts added with
`gpupool cluster add`) behind the one Backend interface, so the control loop schedules them all in one snapshot.

A spoke's nodes are named `<cluster>/<node>` (no Kubernetes node or host name has a slash); the hub's own keep
their names. Each spoke has a thread of its own that reaches it every heartbeat (its nodes are read then): one that
hangs delays only itself. A spoke not reached at its last try is *unreachable*: what it runs is neither alive nor
ended to the control loop (`unreachable(node)`), and its nodes take no new work. One unreachable for longer than
the hub's threshold is *down* (gpupool.control.clusters writes that, and applies the workloads' policies)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gpupool.backends.base import AppEndpoint, Backend, Capabilities, LaunchSpec, Observed, Sample
from gpupool.core import Node

log = logging.getLogger("gpupool.fleet")

SEP = "/"


@dataclass(frozen=True, slots=True)
class SpokeConfig:
    """A spoke as the store keeps it (gpupool.store.tables.ClusterRow): what building its backend needs."""

    name: str
    kind: str
    kubeconfig: str | None = None
    pool_label: str | None = None
    pool_scope: str = "global"
    draining: bool = False

    def fingerprint(self) -> str:
        """What, changed, needs a new backend (draining and the pools' naming do not)."""
        return hashlib.sha256(f"{self.kind}\0{self.kubeconfig or ''}\0{self.pool_label or ''}".encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Health:
    reached: bool
    """Reached at its last try."""
    last_seen: float | None
    """When it was last reached (unix seconds); None: never since this server started."""
    since: float
    """When this server began to reach it (unix seconds): a hub that was itself down does not count that time."""
    error: str | None = None
    tried: bool = True
    """An attempt to reach it has ended, either way. Until then it is neither up nor down: the first one builds its
    client and waits for its pods to be listed, which a loaded hub may take longer than the down threshold for."""


def spoke_of(node: str) -> str | None:
    """The spoke a node belongs to; None for the hub's own."""
    return node.split(SEP, 1)[0] if SEP in node else None


class Spoke:
    """One spoke's backend, built and reached by a thread of its own."""

    def __init__(
        self,
        config: SpokeConfig,
        build: Callable[[SpokeConfig], Backend],
        heartbeat_s: float,
        on_change: Callable[[], None],
    ) -> None:
        self.config = config
        self.fingerprint = config.fingerprint()
        self._build = build
        self._heartbeat_s = heartbeat_s
        self._on_change = on_change
        self.backend: Backend | None = None
        self.nodes: list[Node] = []
        """Its nodes as the hub names them, from its last good reading."""
        self.reached = False
        self.last_seen: float | None = None
        self.since = time.time()
        self.error: str | None = None
        self.tried = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"gpupool-spoke-{config.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        close = getattr(self.backend, "close", None)
        if callable(close):
            with contextlib.suppress(Exception):
                close()

    def beat(self) -> None:
        """Reach it once: build its backend if it has none yet, and read its nodes."""
        was = self.reached
        try:
            if self.backend is None:
                self.backend = self._build(self.config)
            nodes = self.backend.inventory()
        except Exception as e:
            self.reached, self.error = False, " ".join(str(e).split())[:300] or type(e).__name__
            if was:
                log.warning("cluster %s is unreachable: %s", self.config.name, self.error)
        else:
            named = [self._named(n) for n in nodes]
            changed = named != self.nodes
            self.nodes = named
            self.reached, self.error, self.last_seen = True, None, time.time()
            if not was:
                log.info("cluster %s reached: %d node(s)", self.config.name, len(nodes))
            if changed and was:  # its nodes (or what of them is free of other schedulers' pods) changed
                self._on_change()
        self.tried = True
        if was != self.reached:
            self._on_change()

    def _named(self, node: Node) -> Node:
        name = self.config.name
        pool = f"{name}-{node.pool}" if self.config.pool_scope == "cluster" else node.pool
        return replace(node, name=f"{name}{SEP}{node.name}", pool=pool, cluster=name)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.beat()
            self._stop.wait(self._heartbeat_s)


class Fleet:
    """Routes each call to the cluster it concerns: by a launch's node, and, for an allocation or a workload's member,
    by where the store says it runs (`locate_alloc`, `locate_workload`: node names), so a restarted hub routes as
    before."""

    def __init__(
        self,
        home: Backend,
        home_name: str,
        load: Callable[[], list[SpokeConfig]],
        build: Callable[[SpokeConfig], Backend],
        *,
        locate_alloc: Callable[[str], str | None] = lambda _: None,
        locate_workload: Callable[[int, int], str | None] = lambda _w, _r: None,
        heartbeat_s: float = 2.0,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.home = home
        self.home_name = home_name
        self._load = load
        self._build = build
        self._locate_alloc = locate_alloc
        self._locate_workload = locate_workload
        self.heartbeat_s = heartbeat_s
        self._on_change = on_change
        self._lock = threading.Lock()
        self._spokes: dict[str, Spoke] = {}
        self._where: dict[str, str] = {}
        """Allocation → the cluster that runs it, as launched, observed or located in the store."""
        self._dark: frozenset[str] = frozenset()
        self._due = True
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the spokes ------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Read the spokes now (their threads reach them), then again every heartbeat."""
        self.sync()
        self._thread = threading.Thread(target=self._run, name="gpupool-fleet", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            spokes, self._spokes = list(self._spokes.values()), {}
        for spoke in spokes:
            spoke.close()
        close = getattr(self.home, "close", None)
        if callable(close):
            close()

    def _run(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.sync()
            except Exception as e:  # the store is down: the spokes keep their last configuration
                log.debug("reading the clusters failed: %s", e)

    def sync(self) -> None:
        """Start the spokes added since, close those removed, and rebuild those whose kubeconfig changed."""
        configs = {c.name: c for c in self._load()}
        changed = False
        with self._lock:
            for name in [
                n for n, s in self._spokes.items() if n not in configs or s.fingerprint != configs[n].fingerprint()
            ]:
                self._spokes.pop(name).close()
                changed = True
            for name, config in configs.items():
                spoke = self._spokes.get(name)
                if spoke is None:
                    spoke = self._spokes[name] = Spoke(config, self._build, self.heartbeat_s, self._changed)
                    spoke.start()
                    changed = True
                elif spoke.config != config:
                    spoke.config = config  # draining, or its pools' naming
                    changed = True
        if changed:
            self._changed()

    def _changed(self) -> None:
        self._due = True
        self._on_change()

    def inventory_due(self) -> bool:
        """Whether the nodes should be read again before the next cycle (a spoke came, went, or changed)."""
        return self._due

    def spoke_health(self) -> dict[str, Health]:
        with self._lock:
            return {n: Health(s.reached, s.last_seen, s.since, s.error, s.tried) for n, s in self._spokes.items()}

    def spoke(self, name: str) -> Spoke | None:
        with self._lock:
            return self._spokes.get(name)

    def unreachable(self, node: str) -> bool:
        """Whether what runs on this node cannot be told alive or ended now (its spoke was not reached)."""
        cluster = spoke_of(node)
        return cluster is not None and cluster in self._dark

    def cluster_of(self, node: str) -> str:
        return spoke_of(node) or self.home_name

    def _backend_of(self, node: str) -> tuple[Backend, str]:
        """The backend that runs this node, and the node as that backend names it."""
        cluster = spoke_of(node)
        if cluster is None:
            return self.home, node
        spoke = self.spoke(cluster)
        if spoke is None or spoke.backend is None or not spoke.reached:
            raise ConnectionError(f"cluster {cluster} is not reachable")
        return spoke.backend, node.split(SEP, 1)[1]

    def _has_spokes(self) -> bool:
        with self._lock:
            return bool(self._spokes)

    def _for_alloc(self, alloc_id: str) -> Backend | None:
        """Its cluster's backend. Without spokes, the hub's own at once: the app proxy asks on every request, and the
        store is asked only where there is a choice to make (once per allocation: where it runs never changes)."""
        if not self._has_spokes():
            return self.home
        cluster = self._where.get(alloc_id)
        if cluster is None:
            node = self._locate_alloc(alloc_id)
            cluster = (spoke_of(node) if node is not None else None) or self.home_name
            self._where[alloc_id] = cluster
        if cluster == self.home_name:
            return self.home
        spoke = self.spoke(cluster)
        return spoke.backend if spoke is not None else None

    # -- the Backend interface -------------------------------------------------------------------------------
    def inventory(self) -> list[Node]:
        self._due = False
        nodes = [replace(n, cluster=self.home_name) for n in self.home.inventory()]
        with self._lock:
            spokes = list(self._spokes.values())
        for spoke in spokes:
            open_ = spoke.reached and not spoke.config.draining
            nodes += [n if open_ else replace(n, schedulable=False) for n in spoke.nodes]
        return nodes

    def capabilities(self) -> Capabilities:
        return self.home.capabilities()

    def launch(self, spec: LaunchSpec) -> None:
        backend, node = self._backend_of(spec.node)
        cluster = spoke_of(spec.node)
        if cluster is not None:
            self._where[spec.alloc_id] = cluster
        backend.launch(replace(spec, node=node))

    def stop(self, alloc_id: str, force: bool) -> None:
        backend = self._for_alloc(alloc_id)
        if backend is None:
            raise ConnectionError(f"allocation {alloc_id}'s cluster is not reachable")
        backend.stop(alloc_id, force)

    def forget(self, alloc_id: str) -> None:
        backend = self._for_alloc(alloc_id)
        if backend is not None:
            backend.forget(alloc_id)
        self._where.pop(alloc_id, None)

    def observe(self) -> dict[str, Observed] | None:
        seen = self.home.observe()
        if seen is None:
            return None  # the hub's own view is not synced: nothing may be concluded anywhere yet
        merged = dict(seen)
        dark = set()
        with self._lock:
            spokes = list(self._spokes.values())
        for spoke in spokes:
            found = spoke.backend.observe() if spoke.backend is not None and spoke.reached else None
            if found is None:
                dark.add(spoke.config.name)
                continue
            for alloc_id in found:
                self._where[alloc_id] = spoke.config.name
            merged.update(found)
        self._dark = frozenset(dark)
        return merged

    def read_log(self, workload_id: int, rank: int, offset: int, limit: int) -> bytes:
        node = self._locate_workload(workload_id, rank) if self._has_spokes() else None
        backend = self.home if node is None else self._backend_of(node)[0]
        return backend.read_log(workload_id, rank, offset, limit)

    def healthy(self, alloc_id: str, port: int | None) -> bool:
        backend = self._for_alloc(alloc_id)
        return backend is not None and backend.healthy(alloc_id, port)

    def app_endpoint(self, alloc_id: str, port: int | None) -> AppEndpoint | None:
        backend = self._for_alloc(alloc_id)
        return None if backend is None else backend.app_endpoint(alloc_id, port)

    def sample(self) -> Sample:
        home = self.home.sample()
        members, devices, modelled = dict(home.members), list(home.devices), home.modelled
        with self._lock:
            spokes = [s for s in self._spokes.values() if s.backend is not None and s.reached]
        for spoke in spokes:
            assert spoke.backend is not None
            try:
                got = spoke.backend.sample()
            except Exception as e:  # reached a moment ago, not now: no sample this time
                log.debug("sampling cluster %s failed: %s", spoke.config.name, e)
                continue
            members.update(got.members)
            devices += [replace(d, node=f"{spoke.config.name}{SEP}{d.node}") for d in got.devices]
            modelled = modelled or got.modelled
        return Sample(members, tuple(devices), modelled)

    def __getattr__(self, name: str) -> Any:
        # What the hub's own backend offers beyond the protocol (foreign pods, shells, app sockets): its own only.
        if name == "home":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.home, name)
