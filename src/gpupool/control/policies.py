"""Idle and runtime policies: inherited down the organisation tree, where a child may only tighten them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpupool.lifecycle.phases import Phase, StopReason
from gpupool.lifecycle.transitions import request_stop
from gpupool.store.tables import EventRow, QueueRow, WorkloadRow

DEFAULT_IDLE_THRESHOLD_PCT = 5
"""Below this GPU utilisation (of its share) a workload counts as idle."""


@dataclass(frozen=True, slots=True)
class Policy:
    idle_timeout_s: dict[str, float] = field(default_factory=dict)
    max_runtime_s: dict[str, float] = field(default_factory=dict)
    idle_threshold_pct: int = DEFAULT_IDLE_THRESHOLD_PCT
    source: dict[str, str] = field(default_factory=dict)
    """Which queue set each limit, e.g. {"idle_timeout.notebook": "research"}."""


def effective(chain: Sequence[QueueRow]) -> Policy:
    """The tightest value of every limit along a project's chain (project first, then its ancestors)."""
    idle: dict[str, float] = {}
    runtime: dict[str, float] = {}
    threshold = DEFAULT_IDLE_THRESHOLD_PCT
    source: dict[str, str] = {}
    for queue in chain:
        pol: Mapping[str, Any] = queue.policy or {}
        for key, target in (("idle_timeout", idle), ("max_runtime", runtime)):
            for kind, seconds in (pol.get(key) or {}).items():
                if seconds is not None and (kind not in target or float(seconds) < target[kind]):
                    target[kind] = float(seconds)
                    source[f"{key}.{kind}"] = queue.name
        if pol.get("idle_threshold_pct") is not None and int(pol["idle_threshold_pct"]) > threshold:
            threshold = int(pol["idle_threshold_pct"])
            source["idle_threshold_pct"] = queue.name
    return Policy(idle, runtime, threshold, source)


def chains(queues: Sequence[QueueRow]) -> dict[int, list[QueueRow]]:
    by_id = {q.id: q for q in queues}
    out: dict[int, list[QueueRow]] = {}
    for q in queues:
        chain = [q]
        while chain[-1].parent_id is not None and chain[-1].parent_id in by_id and len(chain) < 32:
            chain.append(by_id[chain[-1].parent_id])
        out[q.id] = chain
    return out


def enforce(rows: Sequence[WorkloadRow], policies: Mapping[int, Policy], now: float) -> list[EventRow]:
    """Asks the members of every workload a policy stops now to stop; returns the events."""
    out = []
    for row in rows:
        if row.state != Phase.RUNNING or row.stop_reason is not None:
            continue
        pol = policies[row.project_id]
        idle_limit = pol.idle_timeout_s.get(row.type)
        event = None
        if idle_limit is not None and row.idle_since is not None and now - row.idle_since >= idle_limit:
            event = request_stop(row, StopReason.IDLE, now, idle_s=now - row.idle_since, limit_s=idle_limit)
        run_limit = pol.max_runtime_s.get(row.type)
        if event is None and run_limit is not None and row.started_at is not None and now - row.started_at >= run_limit:
            event = request_stop(row, StopReason.MAX_RUNTIME, now, ran_s=now - row.started_at, limit_s=run_limit)
        declared = row.max_duration_s
        if event is None and declared is not None and row.started_at is not None and now - row.started_at >= declared:
            # The submitter's own limit: stopped as the runtime policy stops work, its args say whose limit.
            event = request_stop(
                row, StopReason.MAX_RUNTIME, now, ran_s=now - row.started_at, limit_s=declared, declared=True
            )
        if event is not None:
            out.append(event)
    return out
