"""Right-sizing advice from telemetry, per workload, and a report of the GPU-hours it would have freed.

The rule. A workload gets advice once it has at least 30 minutes of telemetry samples (minutes with a usage row),
when one of these holds:

- share (one GPU or less per worker: `--gpus 1`, `--gpu F` or `--gpu-memory M`): its peak GPU memory stayed
  under half its grant AND its GPU was busy under 30% of the time it held it (busy GPU-seconds over allocated
  GPU-seconds). It is advised `--gpu-memory M'`, M' its peak with 25% headroom rounded up to whole GiB (at least
  1 GiB), or `--gpu F'`, F' the fraction of its device holding M' and at least twice its busy share, rounded up to
  a tenth; the advice stands only where F' is less than it holds now.
- gpus (several whole GPUs per worker): at its busiest, its utilisation kept fewer GPUs busy than it holds:
  `--gpus k`, k = ceil(peak utilisation × GPUs) and at least the GPUs M' needs. A job of 4 GPUs of which one
  works (peak 25%) gets `--gpus 1`.

Why these. Half an hour passes the warm-up (data loading, compilation, a notebook's first cells) that would
advise from an unrepresentative start. Under half its memory and under 30% busy is the waste manual allocation
leaves (30-50% GPU utilisation is what studies of Philly and PAI found): a request halved still holds the peak
with room, and a fraction shares its GPU with little slowdown; asking users to change for less saves too little
to be worth their time. The headroom (25%, above Kubernetes VPA's 15% safety margin) covers the caching
allocators of PyTorch and TensorFlow, which grow in blocks; twice the busy share leaves room for bursts. The
advice never asks for less memory than was used, and uses the peak, not an average, for memory and for whole
GPUs: running out of either fails a job, while a busy share only slows it.

GPU-hours freed: over a period, the allocated milli-GPU-seconds times the share of the grant the advised request
would not have held (for a share, the fraction's: the larger of the two advised forms, so the figure is not
overstated).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpupool.core import MILLI
from gpupool.core.rightsizing import Grant, Observed
from gpupool.core.rightsizing import advise as rule
from gpupool.models.rightsizing import RightsizingAdvice, RightsizingLine, RightsizingReport, RightsizingTotal
from gpupool.services.auth import Principal
from gpupool.services.errors import Invalid, NotFound
from gpupool.services.org import queue_named
from gpupool.services.reports import check_instants
from gpupool.services.views import gpu_request
from gpupool.store.tables import QueueRow, UsageRow, WorkloadRow

_HOUR = 3600 * MILLI  # milli-GPU-seconds in a GPU-hour
_CHUNK = 500


def advise(grant: Grant, workers: int, seen: Observed) -> RightsizingAdvice | None:
    """The advice the rule gives (gpupool.core.rightsizing; why, in this module's docstring), or None."""
    found = rule(grant, workers, seen)
    if found is None:
        return None
    return RightsizingAdvice(
        rule=found.rule, gpus=found.gpus, gpu=found.gpu, gpu_memory_mib=found.gpu_memory_mib,
        advised_milli=found.advised_milli, granted_milli=found.granted_milli, message=found.message,
    )  # fmt: skip


def grant_of(row: WorkloadRow) -> Grant | None:
    """What one worker of its latest attempt with allocations held; None where it never held a GPU. A device's
    memory is worked out from a share (memory over milli): exact for whole GPUs and fractions, at most 1% low for
    a memory ask of a tenth or more (its milli is rounded up), which only errs towards advising more."""
    attempts = [a.attempt for a in row.allocations]
    if not attempts:
        return None
    latest = [a for a in row.allocations if a.attempt == max(attempts)]
    # Members of a gang hold alike; the largest stands for them all (ties: the lowest rank).
    largest = max(latest, key=lambda a: (sum(int(d["milli"]) for d in a.devices), -a.member))
    milli = sum(int(d["milli"]) for d in largest.devices)
    if milli <= 0:
        return None
    memory = sum(int(d["memory_mib"]) for d in largest.devices)
    device = max(-(-int(d["memory_mib"]) * MILLI // int(d["milli"])) for d in largest.devices if int(d["milli"]))
    return Grant(gpus=row.gpus, milli=milli, memory_mib=memory, device_memory_mib=device)


def lifetimes(session: Session, workload_ids: Sequence[int]) -> dict[int, tuple[int, float, float]]:
    """Per workload: minutes with samples, allocated and busy milli-GPU-seconds, over its life."""
    out: dict[int, tuple[int, float, float]] = {}
    for at in range(0, len(workload_ids), _CHUNK):
        chunk = workload_ids[at : at + _CHUNK]
        rows = session.execute(
            select(
                UsageRow.workload_id,
                func.count(),
                func.sum(UsageRow.milli_seconds),
                func.sum(UsageRow.busy_milli_seconds),
            )
            .where(UsageRow.workload_id.in_(chunk))
            .group_by(UsageRow.workload_id)
        )
        for workload_id, minutes, allocated, busy in rows:
            out[workload_id] = (int(minutes), float(allocated or 0.0), float(busy or 0.0))
    return out


def _observed(row: WorkloadRow, life: tuple[int, float, float] | None) -> Observed | None:
    if life is None or row.gpu_memory_peak_mib is None or row.gpu_util_peak_pct is None:
        return None
    minutes, allocated, busy = life
    return Observed(minutes, allocated, busy, row.gpu_memory_peak_mib, row.gpu_util_peak_pct)


def advice_for(session: Session, row: WorkloadRow) -> RightsizingAdvice | None:
    """The advice for one workload (what `describe` and the portal show): one query, for its usage sums."""
    grant = grant_of(row)
    seen = _observed(row, lifetimes(session, [row.id]).get(row.id))
    if grant is None or seen is None:
        return None
    return advise(grant, row.workers, seen)


def report(session: Session, who: Principal, start: float, end: float, project: str | None = None) -> RightsizingReport:
    """Every workload that held GPUs in [start, end) in the projects the caller may read (or in `project`): its
    request, peak use and advice, and the GPU-hours the advice would have freed, totalled per project."""
    check_instants(start=start, end=end)
    if end <= start:
        raise Invalid("the period is empty: 'to' must be after 'from'")
    only: int | None = None
    if project is not None:
        found = queue_named(session, project, "project")
        if not who.can_read(found.id):
            raise NotFound(f"no project named {project!r}")  # as if it did not exist: 404, not 403
        only = found.id
    names = {q.id: q.name for q in session.scalars(select(QueueRow).where(QueueRow.kind == "project"))}
    query = (
        select(UsageRow.workload_id, func.sum(UsageRow.milli_seconds))
        .join(WorkloadRow, UsageRow.workload_id == WorkloadRow.id)
        .where(UsageRow.minute >= int(start // 60), UsageRow.minute < int(-(-end // 60)))
        .group_by(UsageRow.workload_id)
    )
    if only is not None:
        query = query.where(WorkloadRow.project_id == only)
    elif not who.is_admin:
        query = query.where(WorkloadRow.project_id.in_(sorted(who.project_ids)))
    held = {int(workload_id): float(allocated or 0.0) for workload_id, allocated in session.execute(query)}
    ids = sorted(held)
    rows = _rows(session, ids)
    life = lifetimes(session, ids)
    lines = [_line(row, names.get(row.project_id, "?"), held[row.id], life.get(row.id)) for row in rows]
    lines.sort(key=lambda x: (-x.freed_gpu_hours, x.project, x.workload))
    per_project: dict[str, list[RightsizingLine]] = {}
    for x in lines:
        per_project.setdefault(x.project, []).append(x)
    projects = [_total(name, group) for name, group in sorted(per_project.items())]
    return RightsizingReport(
        start=start, end=end, project=project, lines=lines, projects=projects, total=_total("total", lines)
    )


def _rows(session: Session, ids: Sequence[int]) -> list[WorkloadRow]:
    out: list[WorkloadRow] = []
    for at in range(0, len(ids), _CHUNK):
        out.extend(session.scalars(select(WorkloadRow).where(WorkloadRow.id.in_(ids[at : at + _CHUNK]))))
    return out


def _line(row: WorkloadRow, project: str, allocated: float, life: tuple[int, float, float] | None) -> RightsizingLine:
    grant = grant_of(row)
    seen = _observed(row, life)
    advice = advise(grant, row.workers, seen) if grant is not None and seen is not None else None
    freed = allocated * (advice.granted_milli - advice.advised_milli) / advice.granted_milli if advice else 0.0
    return RightsizingLine(
        project=project,
        workload=row.name,
        state=row.state,
        request=gpu_request(row),
        workers=row.workers,
        sampled_minutes=life[0] if life else 0,
        peak_gpu_memory_mib=row.gpu_memory_peak_mib,
        peak_gpu_util_pct=row.gpu_util_peak_pct,
        busy_pct=round(seen.busy_share * 100, 1) if seen is not None else None,
        gpu_hours=round(allocated / _HOUR, 6),
        freed_gpu_hours=round(freed / _HOUR, 6),
        advice=advice,
    )


def _total(key: str, lines: Iterable[RightsizingLine]) -> RightsizingTotal:
    group = list(lines)
    return RightsizingTotal(
        project=key,
        gpu_hours=round(sum(x.gpu_hours for x in group), 6),
        freed_gpu_hours=round(sum(x.freed_gpu_hours for x in group), 6),
        advised=sum(1 for x in group if x.advice is not None),
    )
