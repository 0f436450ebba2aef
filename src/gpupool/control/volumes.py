"""The volumes each launch mounts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.backends.base import VolumeSpec
from gpupool.lifecycle.phases import LIVE
from gpupool.models.volumes import VolumeMount
from gpupool.store.tables import VolumeRow, WorkloadRow


def volume_specs(
    s: Session, rows: Iterable[WorkloadRow], projects: Mapping[int, str]
) -> dict[int, tuple[VolumeSpec, ...]]:
    """The volumes each live workload mounts, as its launches carry them (read only for those that mount any)."""
    wanted = {r.id: r for r in rows if r.state in LIVE and (r.spec or {}).get("volumes")}
    if not wanted:
        return {}
    project_ids = {r.project_id for r in wanted.values()}
    found = {
        (v.project_id, v.name): v for v in s.scalars(select(VolumeRow).where(VolumeRow.project_id.in_(project_ids)))
    }
    out: dict[int, tuple[VolumeSpec, ...]] = {}
    for wid, row in wanted.items():
        specs = []
        for raw in (row.spec or {}).get("volumes") or []:
            m = VolumeMount.model_validate(raw)
            v = found.get((row.project_id, m.name))
            if v is not None:  # deleted since (refused while it is mounted): its launch goes without
                specs.append(VolumeSpec(v.id, projects[row.project_id], v.name, m.path, v.size_bytes, m.read_only))
        out[wid] = tuple(specs)
    return out
