"""Pools and what admins set for them. A pool is a label nodes carry; its settings live in their own rows,
and a pool without a row has the defaults (devices not shared across projects)."""

from __future__ import annotations

import time
from collections import Counter

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.models.system import PoolPublic, PoolUpdate
from gpupool.services.auth import Principal
from gpupool.services.errors import NotFound
from gpupool.store.tables import NodeRow, PoolRow


def _hardware(session: Session) -> tuple[Counter[str], Counter[str]]:
    """Nodes and GPUs per pool, as the nodes report them now."""
    nodes: Counter[str] = Counter()
    gpus: Counter[str] = Counter()
    for n in session.scalars(select(NodeRow)):
        nodes[n.pool] += 1
        gpus[n.pool] += len(n.devices)
    return nodes, gpus


def _public(name: str, row: PoolRow | None, nodes: Counter[str], gpus: Counter[str]) -> PoolPublic:
    return PoolPublic(
        name=name,
        nodes=nodes[name],
        gpus=gpus[name],
        share_across_projects=row.share_across_projects if row is not None else False,
        updated_at=row.updated_at if row is not None else None,
    )


def list_pools(session: Session, who: Principal) -> list[PoolPublic]:
    """Every pool nodes name, and any an admin has set that has no nodes now, by name. Anyone may read them:
    they say where work can go and whether it may share a device with other projects' work."""
    nodes, gpus = _hardware(session)
    rows = {r.name: r for r in session.scalars(select(PoolRow))}
    return [_public(name, rows.get(name), nodes, gpus) for name in sorted(set(nodes) | set(rows))]


def update_pool(session: Session, who: Principal, name: str, body: PoolUpdate) -> PoolPublic:
    """Change a pool's settings (admins only). The scheduler reads them on its next cycle: work already
    sharing a device keeps running; only new placements follow the new setting."""
    who.require_admin()
    nodes, gpus = _hardware(session)
    # Looked up among the rows rather than by the name as given: it never reaches SQL unless a node names it.
    row = next((r for r in session.scalars(select(PoolRow)) if r.name == name), None)
    if row is None and name not in nodes:
        raise NotFound(f"no pool {name[:80]!r}: no node names it")
    if body.share_across_projects is not None:
        try:
            row = _set(session, row, name, body.share_across_projects)
        except IntegrityError:  # another admin's change created the row first: apply this one over it
            session.rollback()
            row = _set(session, session.get(PoolRow, name), name, body.share_across_projects)
    return _public(name, row, nodes, gpus)


def _set(session: Session, row: PoolRow | None, name: str, share: bool) -> PoolRow:
    now = time.time()
    if row is None:
        row = PoolRow(name=name, share_across_projects=share, created_at=now, updated_at=now)
        session.add(row)
    row.share_across_projects = share
    row.updated_at = now
    session.commit()
    return row
