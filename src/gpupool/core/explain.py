"""Human sentences for pending reasons, and the final pass that gives every waiting workload one."""

from __future__ import annotations

import bisect

from gpupool.core.decision import Pending, PendingCode
from gpupool.core.model import Request, State
from gpupool.core.quota import gpus
from gpupool.core.session import Session
from gpupool.core.state import WorkloadState


def describe(req: Request) -> str:
    if req.gpus:
        gpu = f"{req.gpus} free GPU{'s' if req.gpus > 1 else ''}"
    elif req.gpu_milli:
        gpu = f"a device with {gpus(req.gpu_milli)} of a GPU free"
    elif req.gpu_memory_mib:
        gpu = f"a device with {req.gpu_memory_mib} MiB of GPU memory free"
    else:
        gpu = "room"
    host = []
    if req.cpu_milli:
        host.append(f"{gpus(req.cpu_milli)} CPUs")
    if req.memory_mib:
        host.append(f"{req.memory_mib} MiB of memory")
    return gpu + (f" and {' and '.join(host)}" if host else "")


def where(ws: WorkloadState) -> str:
    w = ws.w
    pools = f"pool{'s' if len(w.pools) > 1 else ''} {', '.join(w.pools)}" if w.pools else "any pool"
    models = f" with GPU model {' or '.join(w.gpu_models)}" if w.gpu_models else ""
    return pools + models


def never_fits(ws: WorkloadState) -> Pending:
    w = ws.w
    what = f"{w.gang_size} members with {describe(w.request)} each" if w.gang_size > 1 else describe(w.request)
    return Pending(w.id, PendingCode.NEVER_FITS, f"no node in {where(ws)} could host {what}, even empty")


def no_room(ws: WorkloadState) -> Pending:
    w = ws.w
    if w.gang_size > 1:
        return Pending(
            w.id,
            PendingCode.GANG_UNPLACEABLE,
            f"gang of {w.gang_size} members, each needing {describe(w.request)}, cannot be placed whole in {where(ws)}",
        )
    return Pending(w.id, PendingCode.NO_NODE_FITS, f"no node in {where(ws)} has {describe(w.request)}")


def unshared(ws: WorkloadState, pool: str) -> Pending:
    """It would fit, in `pool`, only beside other projects' shares, which the pool does not allow."""
    w, req = ws.w, ws.w.request
    free = f"{gpus(req.gpu_milli)} of a GPU" if req.gpu_milli else f"{req.gpu_memory_mib} MiB of GPU memory"
    each = f" for each of its {w.gang_size} members" if w.gang_size > 1 else ""
    return Pending(
        w.id,
        PendingCode.NO_SHAREABLE_DEVICE,
        f"the only devices in {where(ws)} with {free} free{each} are shared with other projects; "
        f"pool {pool} does not allow sharing a device across projects",
    )


def waiting(ws: WorkloadState, victims: int | None = None) -> Pending:
    what = f"{victims} evicted workload{'s' if victims != 1 else ''}" if victims else "evicted workloads"
    return Pending(
        ws.w.id,
        PendingCode.WAITING_FOR_EVICTIONS,
        f"waiting for {what} to release their GPUs; it will start on {_nodes(ws)}",
        nominated=ws.placements,
    )


def explain_all(session: Session) -> tuple[Pending, ...]:
    """A reason for every workload still pending, in workload order."""
    out: list[Pending] = list(session.unknown)
    priorities: dict[int, list[int]] = {}
    for ws in session.state.workloads:
        if ws.state is State.PENDING or (ws.bound and ws.pipelined):
            priorities.setdefault(ws.queue, []).append(ws.w.priority)
    for values in priorities.values():
        values.sort()
    for ws in session.state.workloads:
        if ws.bound and ws.pipelined:
            out.append(session.pending.get(ws.idx) or waiting(ws))
            continue
        if ws.state is not State.PENDING:
            continue
        reason = session.pending.get(ws.idx) or no_room(ws)
        if reason.code in (PendingCode.NO_NODE_FITS, PendingCode.GANG_UNPLACEABLE):
            values = priorities[ws.queue]
            higher = len(values) - bisect.bisect_right(values, ws.w.priority)
            if higher:
                reason = Pending(
                    ws.w.id,
                    PendingCode.QUEUED_BEHIND,
                    f"queued behind {higher} higher-priority workload{'s' if higher > 1 else ''} "
                    f"of project {ws.w.project}; {reason.message}",
                )
        out.append(reason)
    out.sort(key=lambda p: p.workload)
    return tuple(out)


def _nodes(ws: WorkloadState) -> str:
    return ", ".join(sorted({p.node for p in ws.placements}))
