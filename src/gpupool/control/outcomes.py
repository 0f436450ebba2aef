"""The log lines a cycle writes for what it decided: a bind, a stop."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from gpupool.lifecycle.events import EventCode
from gpupool.lifecycle.phases import EVICTIONS
from gpupool.logs import current_cycle
from gpupool.store.tables import EventRow, WorkloadRow

log = logging.getLogger("gpupool.control")


def log_outcome(events: Iterable[EventRow], rows: Mapping[int, WorkloadRow], projects: Mapping[int, str]) -> None:
    """One line per bind and per stop the cycle decided (once it is committed): the workload, its project, and
    its nodes or the stop's reason code; `event` says which ("bind", "eviction" for what gpupool_evictions_total
    counts, "stop" for the rest, a failed member). They name their cycle whichever handler writes them."""
    cycle = current_cycle()
    for ev in events:
        row = rows.get(ev.workload_id)
        if row is None or ev.code not in (EventCode.PLACED, EventCode.STOP_REQUESTED):
            continue
        project = projects.get(row.project_id, str(row.project_id))
        fields: dict[str, object] = {"cycle_id": cycle, "workload_id": row.id, "workload": row.name, "project": project}
        if ev.code == EventCode.PLACED:
            nodes = list(ev.args.get("nodes", []))
            extra = {**fields, "event": "bind", "nodes": nodes}
            log.info("bind %s/%s (id %d) on %s", project, row.name, row.id, ", ".join(nodes), extra=extra)
        else:
            kind = "eviction" if ev.reason_code in EVICTIONS else "stop"
            extra = {**fields, "event": kind, "reason": ev.reason_code}
            log.info("%s of %s/%s (id %d): %s", kind, project, row.name, row.id, ev.reason_code, extra=extra)
