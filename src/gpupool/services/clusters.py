"""The fleet's clusters: the hub's own (its settings' backend, always there) and the spokes admins add. Anyone may
list them (they say where work may go); only admins add, drain, remove or describe one (a description names the
workloads that run there, whoever's they are)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import yaml
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from gpupool.lifecycle.phases import LIVE, AllocPhase, BurstEnd, BurstPhase
from gpupool.models.clusters import (
    MICRO,
    BurstNodePublic,
    BurstPublic,
    BurstSettings,
    ClusterCreate,
    ClusterDetail,
    ClusterKind,
    ClusterPublic,
    ClusterStatus,
    PoolScope,
)
from gpupool.services import audit
from gpupool.services.auth import Principal
from gpupool.services.errors import Conflict, Invalid, NotFound
from gpupool.store.burst_bills import spent_micro
from gpupool.store.tables import AllocationRow, BurstNodeRow, ClusterRow, NodeRow, QueueRow, WorkloadRow


@dataclass(frozen=True, slots=True)
class Home:
    """The hub's own cluster, as its settings make it."""

    name: str
    backend: str
    """Its backend's name: local or kubernetes."""


@dataclass
class _Tally:
    nodes: Counter[str]
    gpus: Counter[str]
    pools: dict[str, set[str]]
    node_names: dict[str, list[str]]
    allocated: Counter[str]
    running: dict[str, set[str]]


def _tally(session: Session, home: Home) -> _Tally:
    t = _Tally(Counter(), Counter(), {}, {}, Counter(), {})
    clusters: dict[str, str] = {}
    for n in session.scalars(select(NodeRow).order_by(NodeRow.name)):
        cluster = clusters[n.name] = n.cluster or home.name
        t.pools.setdefault(cluster, set()).add(n.pool)
        t.node_names.setdefault(cluster, []).append(n.name)
        if n.schedulable:
            t.nodes[cluster] += 1
            t.gpus[cluster] += len(n.devices)
    projects: dict[int, str] = {i: n for i, n in session.execute(select(QueueRow.id, QueueRow.name))}
    query = (
        select(AllocationRow.node, AllocationRow.devices, WorkloadRow.project_id, WorkloadRow.name)
        .join(WorkloadRow, AllocationRow.workload_id == WorkloadRow.id)
        .where(
            WorkloadRow.state.in_(sorted(LIVE)),
            AllocationRow.attempt == WorkloadRow.attempt,
            AllocationRow.state != AllocPhase.ENDED.value,
        )
    )
    for node, devices, project_id, name in session.execute(query):
        cluster = clusters.get(node, home.name)
        t.allocated[cluster] += sum(int(d.get("milli", 1000)) for d in devices)
        t.running.setdefault(cluster, set()).add(f"{projects.get(project_id, '?')}/{name}")
    return t


def _public(name: str, row: ClusterRow | None, home: Home, t: _Tally) -> ClusterPublic:
    return ClusterPublic(
        name=name,
        kind=ClusterKind.HOME if row is None else ClusterKind(row.kind),
        status=ClusterStatus.UP if row is None else ClusterStatus(row.status),
        draining=False if row is None else row.draining,
        pool_scope=PoolScope.GLOBAL if row is None else PoolScope(row.pool_scope),
        pool_label=None if row is None else row.pool_label,
        burst=None if row is None or row.burst is None else _burst_public(row.burst),
        last_seen_at=None if row is None else row.last_seen_at,
        down_since=None if row is None else row.down_since,
        nodes=t.nodes[name],
        gpus=t.gpus[name],
        allocated_gpus=t.allocated[name] / 1000,
        workloads=len(t.running.get(name, ())),
    )


def _burst_public(stored: dict[str, Any]) -> BurstPublic:
    return BurstPublic(
        price_per_gpu_hour=int(stored["price_micro"]) / MICRO, delay_s=float(stored["delay_s"]),
        max_gpus=int(stored["max_gpus"]), node_gpus=int(stored["node_gpus"]),
        idle_release_s=float(stored["idle_release_s"]), gpu_model=stored.get("gpu_model"),
    )  # fmt: skip


def burst_stored(b: BurstSettings) -> dict[str, Any]:
    """As the store keeps it: money in micro-dollars."""
    return {
        "price_micro": round(b.price_per_gpu_hour * MICRO), "delay_s": b.delay_s, "max_gpus": b.max_gpus,
        "node_gpus": b.node_gpus, "idle_release_s": b.idle_release_s, "gpu_model": b.gpu_model,
    }  # fmt: skip


def list_clusters(session: Session, who: Principal, home: Home) -> list[ClusterPublic]:
    t = _tally(session, home)
    rows = session.scalars(select(ClusterRow).order_by(ClusterRow.name)).all()
    return [_public(home.name, None, home, t)] + [_public(r.name, r, home, t) for r in rows]


def describe(session: Session, who: Principal, home: Home, name: str, now: float | None = None) -> ClusterDetail:
    who.require_admin()
    now = time.time() if now is None else now
    row = _row(session, home, name)
    t = _tally(session, home)
    return ClusterDetail(
        **_public(name, row, home, t).model_dump(),
        pools=sorted(t.pools.get(name, ())),
        node_names=t.node_names.get(name, []),
        running=sorted(t.running.get(name, ())),
        burst_nodes=_burst_nodes(session, name, now),
    )


RECENT_S = 86400.0
"""How long a burst node given back is still shown with its cluster."""


def _burst_nodes(session: Session, cluster: str, now: float) -> list[BurstNodePublic]:
    query = (
        select(BurstNodeRow)
        .where(BurstNodeRow.cluster == cluster)
        .where(or_(BurstNodeRow.released_at.is_(None), BurstNodeRow.released_at >= now - RECENT_S))
        .order_by(BurstNodeRow.asked_at.desc(), BurstNodeRow.name)
        .limit(100)
    )
    return [_burst_node(r, now) for r in session.scalars(query)]


def _burst_node(r: BurstNodeRow, now: float) -> BurstNodePublic:
    return BurstNodePublic(
        name=r.name, department=r.department, phase=BurstPhase(r.phase), node=r.node, gpus=r.gpus,
        price_per_gpu_hour=r.price_micro / MICRO, asked_at=r.asked_at, ready_at=r.ready_at,
        released_at=r.released_at, end_reason=BurstEnd(r.end_reason) if r.end_reason else None, message=r.message,
        cost=spent_micro([r], r.asked_at, now) / MICRO,
    )  # fmt: skip


def _row(session: Session, home: Home, name: str) -> ClusterRow | None:
    """The spoke's row; None for the hub's own cluster. Looked up among the rows, so a name never reaches SQL."""
    if name == home.name:
        return None
    row = next((r for r in session.scalars(select(ClusterRow)) if r.name == name), None)
    if row is None:
        raise NotFound(f"no cluster named {name[:80]!r}")
    return row


def add(session: Session, who: Principal, home: Home, body: ClusterCreate) -> ClusterPublic:
    """A spoke the hub schedules from its next heartbeat on. Its kubeconfig is kept as a secret (never shown back)."""
    who.require_admin()
    audit.note(obj=f"cluster/{body.name}")
    if (body.kubeconfig is None) == (not body.local):
        raise Invalid("give a cluster either a kubeconfig or --local (this host), not both nor neither")
    if body.name == home.name or session.get(ClusterRow, body.name) is not None:
        raise Conflict(f"a cluster named {body.name!r} already exists")
    if body.local and body.burst is not None:
        raise Invalid("burst capacity is asked of a Kubernetes cluster's autoscaler: give a kubeconfig, not --local")
    if body.local:
        if home.backend == "local":
            raise Conflict(f"this host is already the hub's own cluster {home.name!r}")
        if session.scalar(select(ClusterRow.name).where(ClusterRow.kind == ClusterKind.LOCAL.value)) is not None:
            raise Conflict("this host is already a cluster of the fleet")
    else:
        _check_kubeconfig(body.kubeconfig or "")
    now = time.time()
    row = ClusterRow(
        name=body.name,
        kind=(ClusterKind.LOCAL if body.local else ClusterKind.KUBERNETES).value,
        kubeconfig=body.kubeconfig,
        pool_label=body.pool_label,
        pool_scope=body.pool_scope.value,
        burst=None if body.burst is None else burst_stored(body.burst),
        draining=False,
        status=ClusterStatus.UNKNOWN.value,
        created_at=now,
        updated_at=now,
    )
    session.add(row)
    session.commit()
    return _public(row.name, row, home, _tally(session, home))


def _check_kubeconfig(text: str) -> None:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise Invalid(f"the kubeconfig is not YAML: {' '.join(str(e).split())[:200]}") from None
    if not isinstance(doc, dict) or not doc.get("clusters") or not doc.get("contexts"):
        raise Invalid("the kubeconfig names no cluster and context (kubectl config view --minify --raw makes one)")
    current = doc.get("current-context")
    names = {c.get("name") for c in doc["contexts"] if isinstance(c, dict)}
    if current not in names:
        raise Invalid(f"the kubeconfig's current-context {current!r} is not among its contexts")


def drain(session: Session, who: Principal, home: Home, name: str, draining: bool) -> ClusterPublic:
    """A draining cluster takes no new work; what runs there runs on (cancel it, or wait for it, before removing
    the cluster). The hub's own cluster is drained node by node, as before, not here."""
    who.require_admin()
    audit.note(obj=f"cluster/{name}")
    row = _row(session, home, name)
    if row is None:
        raise Invalid(f"{name!r} is the hub's own cluster: cordon its nodes instead")
    row.draining, row.updated_at = draining, time.time()
    session.commit()
    return _public(name, row, home, _tally(session, home))


def remove(session: Session, who: Principal, home: Home, name: str) -> None:
    """Forget a spoke and its nodes; refused while live workloads have members there."""
    who.require_admin()
    audit.note(obj=f"cluster/{name}")
    row = _row(session, home, name)
    if row is None:
        raise Invalid(f"{name!r} is the hub's own cluster and cannot be removed")
    running = sorted(_tally(session, home).running.get(name, ()))
    if running:
        shown = ", ".join(running[:5]) + (f" and {len(running) - 5} more" if len(running) > 5 else "")
        raise Conflict(f"cluster {name!r} still runs {shown}: drain it and wait for them, or cancel them, first")
    for node in session.scalars(select(NodeRow).where(NodeRow.cluster == name)):
        session.delete(node)
    session.delete(row)
    session.commit()
