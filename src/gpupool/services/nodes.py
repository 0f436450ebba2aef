"""The GPU map: every device, its model, how much of it is allocated, and to which workloads."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.models.schemas import DeviceUsage, NodePublic
from gpupool.services.auth import Principal
from gpupool.store.holdings import holdings
from gpupool.store.tables import NodeRow


def list_nodes(session: Session, who: Principal) -> list[NodePublic]:
    usage: dict[tuple[str, int], tuple[int, list[str]]] = {}
    for h in holdings(session):
        label = h.workload if who.can_read(h.project_id) else "(another project)"
        milli, names = usage.get((h.node, h.device), (0, []))
        usage[(h.node, h.device)] = (milli + h.milli, [*names, label])
    out = []
    for n in session.scalars(select(NodeRow).order_by(NodeRow.name)):
        devices = []
        for d in n.devices:
            milli, names = usage.get((n.name, int(d["index"])), (0, []))
            devices.append(
                DeviceUsage(
                    index=int(d["index"]),
                    model=str(d["model"]),
                    memory_mib=int(d["memory_mib"]),
                    allocated_milli=milli,
                    workloads=sorted(names),
                )
            )
        out.append(
            NodePublic(
                name=n.name,
                pool=n.pool,
                cluster=n.cluster,
                backend=n.backend,
                schedulable=n.schedulable,
                cpu_milli=n.cpu_milli,
                memory_mib=n.memory_mib,
                devices=devices,
            )
        )
    return out
