"""Why a queued workload waits, in words: the one place a scheduler reason (a PendingReason and the core's
arguments, `gpupool.core.decision.Pending.args`) becomes a sentence, for the API, the CLI and the portal.

Arguments come in the core's integer units (milli-GPU, millicores, MiB, whole seconds since the epoch) and are
shown as GPUs, CPUs and GiB. A row whose arguments are missing or incomplete (written before they existed) shows
the sentence the core gave (`detail`). Its position in its project's queue and among the work that can use its
pools is counted here per request: it moves whenever anything ahead of it starts, so it is never stored."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from gpupool.lifecycle.events import EventCode, stop_cause
from gpupool.lifecycle.phases import QUEUED, REQUEUES, PendingReason, Resumes, StopReason
from gpupool.lifecycle.transitions import suspended_by
from gpupool.models.schemas import QueuePosition, Suspension
from gpupool.store.tables import WorkloadRow

Args = Mapping[str, Any]

UNITS = {"gpu": "GPUs", "cpu": "CPUs", "memory": "GiB of memory"}


def number(value: int, per: int) -> str:
    """An integer count of 1/per units as a short decimal: 6000/1000 -> '6', 250/1000 -> '0.25'."""
    return f"{value / per:.2f}".rstrip("0").rstrip(".")


def gpus(milli: int) -> str:
    return number(milli, 1000)


def gib(mib: int) -> str:
    return number(mib, 1024)


def _amount(resource: str, value: int) -> str:
    return gib(value) if resource == "memory" else gpus(value)


def _unit(resource: str, value: int) -> str:
    """The unit after an amount of `value` (milli-GPU, millicores, MiB): one GPU or CPU or a part of one is
    singular, as a request is written ('1 GPU', '0.5 GPU'); memory is in GiB whatever the amount."""
    unit = UNITS[resource]
    return unit.removesuffix("s") if resource != "memory" and 0 < value <= 1000 else unit


def _gpu_count(milli: int) -> str:
    return f"{gpus(milli)} {_unit('gpu', milli)}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def request(a: Args) -> str:
    """What one member asks for, from the request arguments (`gpus`, `gpu_milli`, `gpu_memory_mib`, `cpu_milli`,
    `memory_mib`)."""
    if a.get("gpus"):
        gpu = f"{_plural(int(a['gpus']), 'free GPU')}"
    elif a.get("gpu_milli"):
        gpu = f"a device with {gpus(int(a['gpu_milli']))} of a GPU free"
    elif a.get("gpu_memory_mib"):
        gpu = f"a device with {gib(int(a['gpu_memory_mib']))} GiB of GPU memory free"
    else:
        gpu = "room"
    host = [f"{gpus(int(a['cpu_milli']))} CPUs"] if a.get("cpu_milli") else []
    host += [f"{gib(int(a['memory_mib']))} GiB of memory"] if a.get("memory_mib") else []
    return gpu + "".join(f" and {h}" for h in host)


def lacks(a: Args) -> str:
    parts = []
    if a.get("lacks_gpus"):
        parts.append(_plural(int(a["lacks_gpus"]), "free GPU"))
    if a.get("lacks_gpu_milli"):
        parts.append(f"{gpus(int(a['lacks_gpu_milli']))} of a GPU")
    if a.get("lacks_gpu_memory_mib"):
        parts.append(f"{gib(int(a['lacks_gpu_memory_mib']))} GiB of GPU memory")
    if a.get("lacks_cpu_milli"):
        parts.append(f"{gpus(int(a['lacks_cpu_milli']))} CPUs")
    if a.get("lacks_memory_mib"):
        parts.append(f"{gib(int(a['lacks_memory_mib']))} GiB of memory")
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else "".join(parts)


def _quota(a: Args) -> tuple[str, str, str, str, str]:
    """Who, where, and the numbers of a quota reason: '<level> <queue>', pool, 'uses U of Q <unit>', 'asks A',
    'N over'."""
    resource = str(a["resource"])
    used, quota, asks = int(a["used"]), int(a["quota"]), int(a["asks"])
    bound = max(quota, int(a.get("fair", quota)))
    return (
        f"{a['level']} {a['queue']}",
        str(a["pool"]),
        f"uses {_amount(resource, used)} of {_amount(resource, quota)} {_unit(resource, quota)}",
        f"asks {_amount(resource, asks)}",
        f"{_amount(resource, used + asks - bound)} over",
    )


def _over_limit(a: Args) -> str:
    who, pool, uses, asks, over = _quota(a)
    return f"would put {who} over its limit in pool {pool}: {uses}, {asks} ({over})"


def _nonpreemptible(a: Args) -> str:
    who, pool, uses, asks, over = _quota(a)
    return (
        f"not preemptible, so it must fit in the deserved quota of {who} in pool {pool}: "
        f"non-preemptible work {uses}, {asks} ({over})"
    )


def _over_deserved(a: Args) -> str:
    who, pool, _, asks, _ = _quota(a)
    resource = str(a["resource"])
    used, deserved = int(a["used"]), _amount(resource, int(a["quota"]))
    fair = f" (fair share {gpus(int(a['fair']))})" if int(a.get("fair", a["quota"])) != int(a["quota"]) else ""
    return (
        f"would take {who} past its deserved quota in pool {pool}: uses {_amount(resource, used)} "
        f"{_unit(resource, used)}, deserves "
        f"{deserved}{fair}, {asks}; beyond it, preemptible work only borrows idle GPUs, and none are idle for it"
    )


def _closest(a: Args, what: str) -> str:
    """Where the core named the node closest to hosting one member, and what that node lacks."""
    return f"; the closest {what}, {a['node']}, lacks {lacks(a)}" if a.get("node") and lacks(a) else ""


def _no_node_fits(a: Args) -> str:
    return f"no node has {request(a)} now" + _closest(a, "node")


def _gang(a: Args) -> str:
    fits = f": {a['fits']} of them fit now" if "fits" in a else ""
    return f"gang of {a['members']} members, each needing {request(a)}, cannot be placed whole{fits}" + _closest(
        a, "node for one more member"
    )


def _never_fits(a: Args) -> str:
    members = int(a.get("members", 1))
    what = f"{members} members with {request(a)} each" if members > 1 else request(a)
    return f"no node could host {what}, even empty"


def _unshared(a: Args) -> str:
    return (
        f"it fits only on devices that other projects' shares hold, and pool {a['pool']} does not share a device "
        f"across projects"
    )


def _evictions(a: Args) -> str:
    victims = int(a["victims"])
    borrowers = str(a.get("borrowers") or "")
    of = f" of project{'s' if ',' in borrowers else ''} {borrowers.replace(',', ', ')}" if borrowers else ""
    nodes = str(a.get("nodes") or "").replace(",", ", ")
    return f"waiting for {_plural(victims, 'evicted workload')}{of} to release {_gpu_count(int(a['gpu_milli']))}" + (
        f"; it will start on {nodes}" if nodes else ""
    )


def when(seconds: int) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _min_runtime(a: Args) -> str:
    return (
        f"waiting for {a.get('victim') or 'a workload'} of project {a['project']} to pass its minimum runtime at "
        f"{when(int(a['until']))}; then its {_gpu_count(int(a['gpu_milli']))} may be taken"
    )


def _behind(a: Args) -> str:
    ahead = f"queued behind {_plural(int(a['ahead']), 'higher-priority workload')} of project {a['project']}"
    blocker = str(a.get("blocker", ""))
    then = _SENTENCES.get(blocker)
    return ahead if then is None else f"{ahead}; {then(a)}"


_SENTENCES: dict[str, Callable[[Args], str]] = {
    PendingReason.OVER_LIMIT: _over_limit,
    PendingReason.NONPREEMPTIBLE_OVER_DESERVED: _nonpreemptible,
    PendingReason.OVER_DESERVED: _over_deserved,
    PendingReason.NO_NODE_FITS: _no_node_fits,
    PendingReason.GANG_UNPLACEABLE: _gang,
    PendingReason.NEVER_FITS: _never_fits,
    PendingReason.NO_SHAREABLE_DEVICE: _unshared,
    PendingReason.WAITING_FOR_EVICTIONS: _evictions,
    PendingReason.MIN_RUNTIME: _min_runtime,
    PendingReason.QUEUED_BEHIND: _behind,
}


def sentence(code: str | None, args: Args, detail: str | None = None) -> str:
    """The sentence for a scheduler reason; `detail` (the core's own) where the arguments do not say enough."""
    render = _SENTENCES.get(code or "")
    if render is not None and args:
        try:
            return render(args)
        except (KeyError, ValueError, TypeError):
            pass  # arguments from before a field existed, or not the scheduler's: its own sentence says it
    if detail:
        return detail
    return "waiting for the scheduler" if code in (None, PendingReason.WAITING) else str(code)


def _short_quota(a: Args, what: str) -> str:
    resource = str(a["resource"])
    return (
        f"{what}: {a['queue']} {_amount(resource, int(a['used']))}+{_amount(resource, int(a['asks']))}"
        f"/{_amount(resource, int(a['quota']))} {UNITS[resource].split()[0]} in {a['pool']}"
    )


_SHORT: dict[str, Callable[[Args], str]] = {
    PendingReason.OVER_LIMIT: lambda a: _short_quota(a, "over limit"),
    PendingReason.NONPREEMPTIBLE_OVER_DESERVED: lambda a: _short_quota(a, "over deserved (not preemptible)"),
    PendingReason.OVER_DESERVED: lambda a: _short_quota(a, "over deserved"),
    PendingReason.NO_NODE_FITS: lambda a: "no node fits" + (f" (closest {a['node']})" if a.get("node") else ""),
    PendingReason.GANG_UNPLACEABLE: lambda a: (
        f"gang of {a['members']} does not fit whole" + (f" ({a['fits']} fit)" if "fits" in a else "")
    ),
    PendingReason.NEVER_FITS: lambda a: "never fits",
    PendingReason.NO_SHAREABLE_DEVICE: lambda a: f"no shareable device in {a['pool']}",
    PendingReason.WAITING_FOR_EVICTIONS: lambda a: f"waiting for {_plural(int(a['victims']), 'eviction')}",
    PendingReason.MIN_RUNTIME: lambda a: (
        f"min runtime of {a.get('victim') or a['project']} until {when(int(a['until']))[11:16]} UTC"
    ),
    PendingReason.QUEUED_BEHIND: lambda a: (
        f"behind {a['ahead']}" + (f"; {_SHORT[str(a['blocker'])](a)}" if str(a.get("blocker")) in _SHORT else "")
    ),
}


def short(code: str | None, args: Args) -> str:
    """A few words for a list: the blocker and its key numbers."""
    render = _SHORT.get(code or "")
    if render is not None and args:
        try:
            return render(args)
        except (KeyError, ValueError, TypeError):
            pass
    return "waiting for the scheduler" if code in (None, PendingReason.WAITING) else str(code).replace("-", " ")


def of_row(row: WorkloadRow) -> tuple[dict[str, Any], str | None]:
    """A queued row's scheduler arguments (without the sentence) and the core's sentence; ({}, None) for any
    other row."""
    stored = row.reason_args or {}
    if row.reason_event != EventCode.QUEUED or "detail" not in stored:
        return {}, None
    return {k: v for k, v in stored.items() if k != "detail"}, str(stored["detail"])


def position(session: Session, row: WorkloadRow) -> QueuePosition | None:
    """Where a queued workload stands in its project's queue, by priority then submit time (the order the
    scheduler serves a project in; between projects it takes turns by fair share, so no count across projects
    would say when its turn comes: the estimated start does). One pass over the project's queued rows, by the
    (project_id, id) index."""
    if row.state not in QUEUED or row.hold:
        return None
    ahead = or_(
        WorkloadRow.priority > row.priority,
        and_(WorkloadRow.priority == row.priority, WorkloadRow.queued_at < row.queued_at),
        and_(WorkloadRow.priority == row.priority, WorkloadRow.queued_at == row.queued_at, WorkloadRow.id < row.id),
    )
    counts = select(func.count().filter(ahead), func.count()).where(
        WorkloadRow.project_id == row.project_id, WorkloadRow.state.in_(sorted(QUEUED)), WorkloadRow.hold.is_(False)
    )
    in_project, project_total = session.execute(counts).one()
    return QueuePosition(project=int(in_project) + 1, project_queued=int(project_total))


def _cause(stop: StopReason, a: Args) -> str:
    """What stopped a suspended notebook, from its stop's typed arguments (gpupool.control.causes)."""
    by, priority, project = a.get("by"), a.get("by_priority"), a.get("by_project")
    whom = f"'{by}'" if by else f"a workload of project {project}" if project else None
    if stop == StopReason.PREEMPT and whom is not None:
        return f"preempted by {whom}" + (f" ({priority})" if priority else "")
    if stop == StopReason.RECLAIM and project:
        return f"reclaimed for project {project} (below its fair share)"
    if stop == StopReason.CONSOLIDATE and whom is not None:
        return f"moved to make room for {whom}"
    if stop in (StopReason.PREEMPT, StopReason.RECLAIM, StopReason.CONSOLIDATE):
        return {StopReason.PREEMPT: "preempted", StopReason.RECLAIM: "reclaimed"}.get(stop, "moved")
    return stop_cause(stop.value, a)


def _needs(row: WorkloadRow) -> str:
    """What has to be free for it to start, from its request: "1 GPU is", "0.25 of a GPU is"."""
    if row.gpus:
        return f"{row.gpus} GPU is" if row.gpus == 1 else f"{row.gpus} GPUs are"
    if row.gpu_milli:
        return f"{gpus(row.gpu_milli)} of a GPU is"
    if row.gpu_memory_mib:
        return f"{gib(row.gpu_memory_mib)} GiB of GPU memory is"
    return "room is"


def _eta(row: WorkloadRow) -> str:
    if row.eta is not None:
        return f", ETA {when(int(row.eta))}"
    if row.eta_basis == "none":
        return ", no ETA while the work holding its room runs on"
    return ""  # not estimated yet


def _where(row: WorkloadRow, a: Args) -> str | None:
    """The pool it ran in, else those it accepts; None: any."""
    return str(a["pool"]) if a.get("pool") else " or ".join(str(p) for p in row.pools) or None


def suspension(row: WorkloadRow) -> Suspension | None:
    """Why a suspended notebook is not running and when it will be back, for its owner: "suspended: preempted by
    'train' (training) at <time>; resumes by itself when 1 GPU is free in pool default, ETA <time>". The pool is
    the one it ran in (else those it accepts); the ETA is the scheduler's estimate (gpupool.control.estimates).
    None for any other row."""
    found = suspended_by(row)
    if found is None:
        return None
    stop, at, a = found
    where = _where(row, a)
    if row.hold:
        resumes, back = Resumes.ON_RESUME, "resume it to start again"
    else:
        resumes = Resumes.AUTOMATICALLY
        place = f"pool{'s' if ' or ' in (where or '') else ''} {where}" if where else "any pool"
        back = f"resumes by itself when {_needs(row)} free in {place}{_eta(row)}"

    def text(key: str) -> str | None:
        return str(a[key]) if a.get(key) else None

    return Suspension(
        reason=stop.value, at=at, by=text("by"), by_priority=text("by_priority"), by_project=text("by_project"),
        pool=text("pool"), resumes=resumes.value, notice=f"suspended: {_cause(stop, a)} at {when(int(at))}; {back}",
    )  # fmt: skip


def suspension_short(row: WorkloadRow) -> str:
    """The notice in a few words for a list, whose STATE and ETA columns say the rest: "preempted by 'train'
    (training) at 18:22 UTC; resumes when 1 GPU is free in default"."""
    found = suspended_by(row)
    if found is None:
        return ""
    stop, at, a = found
    where = _where(row, a) or "any pool"
    return f"{_cause(stop, a)} at {when(int(at))[11:16]} UTC; resumes when {_needs(row)} free in {where}"


def tells_suspension(row: WorkloadRow, s: Suspension) -> bool:
    """Whether its notice is the reason its owner reads: a notebook the scheduler stopped, waiting to come back (one
    a policy suspended keeps its own reason, which says to resume it)."""
    return s.resumes == Resumes.AUTOMATICALLY and s.reason in REQUEUES and row.state in QUEUED
