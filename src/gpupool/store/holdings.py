"""What is held right now: every device share of every live allocation, with its workload and project.
The GPU map, the quota views and /metrics all read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.lifecycle.phases import HOLDING, LIVE
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


def live_devices(session: Session) -> set[tuple[str, int]]:
    """(node, device) of every member of live workloads' current attempts, ended members of a gang included: what
    the scheduler takes as placed."""
    query = (
        select(AllocationRow.node, AllocationRow.devices)
        .join(WorkloadRow, AllocationRow.workload_id == WorkloadRow.id)
        .where(WorkloadRow.state.in_(sorted(LIVE)), AllocationRow.attempt == WorkloadRow.attempt)
    )
    return {(node, int(d["index"])) for node, devices in session.execute(query) for d in devices}


def still_held(
    node: str, offered: list[dict[str, Any]], before: list[dict[str, Any]], held: set[tuple[str, int]]
) -> list[dict[str, Any]]:
    """A node's devices as the backend offers them now, plus those it no longer offers (another scheduler's pod
    took them) that live work of gpupool's still holds: the scheduler must see what it placed, or it cannot
    account for it."""
    have = {int(d["index"]) for d in offered}
    kept = [d for d in before if (node, int(d["index"])) in held and int(d["index"]) not in have]
    return sorted([*offered, *kept], key=lambda d: int(d["index"]))
