"""The GPU map: every device, its model, how much of it is allocated, and to which workloads."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.api.schemas import DeviceUsage, NodePublic
from gpupool.services.auth import Principal
from gpupool.store.tables import AllocationRow, NodeRow, WorkloadRow


def list_nodes(session: Session, who: Principal) -> list[NodePublic]:
    usage: dict[tuple[str, int], tuple[int, list[str]]] = {}
    rows = session.execute(
        select(AllocationRow, WorkloadRow.name, WorkloadRow.project_id)
        .join(WorkloadRow, AllocationRow.workload_id == WorkloadRow.id)
        .where(AllocationRow.state != "ended")
    )
    for alloc, name, project_id in rows:
        label = name if who.can_read(project_id) else "(another project)"
        for d in alloc.devices:
            key = (alloc.node, int(d["index"]))
            milli, names = usage.get(key, (0, []))
            usage[key] = (milli + int(d["milli"]), [*names, label])
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
                backend=n.backend,
                schedulable=n.schedulable,
                cpu_milli=n.cpu_milli,
                memory_mib=n.memory_mib,
                devices=devices,
            )
        )
    return out
