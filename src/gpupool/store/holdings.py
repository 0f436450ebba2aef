"""What is held right now: every device share of every live allocation, with its workload and project.
The GPU map, the quota views and /metrics all read it."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.lifecycle.phases import HOLDING
from gpupool.store.tables import AllocationRow, WorkloadRow


@dataclass(frozen=True, slots=True)
class Holding:
    node: str
    device: int
    milli: int
    workload: str
    project_id: int


def holdings(session: Session) -> list[Holding]:
    rows = session.execute(
        select(AllocationRow.node, AllocationRow.devices, WorkloadRow.name, WorkloadRow.project_id)
        .join(WorkloadRow, AllocationRow.workload_id == WorkloadRow.id)
        .where(AllocationRow.state.in_(sorted(HOLDING)))
    )
    return [
        Holding(node, int(d["index"]), int(d["milli"]), name, project_id)
        for node, devices, name, project_id in rows
        for d in devices
    ]


def by_device(held: list[Holding]) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for h in held:
        out[(h.node, h.device)] = out.get((h.node, h.device), 0) + h.milli
    return out


def by_project(held: list[Holding]) -> dict[int, int]:
    out: dict[int, int] = {}
    for h in held:
        out[h.project_id] = out.get(h.project_id, 0) + h.milli
    return out
