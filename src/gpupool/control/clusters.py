"""The fleet's clusters as the leader keeps them, each cycle: their heartbeats written to the store (up, or down
once unreachable past the threshold), the workloads of a down cluster moved on per their policy, and what was
abandoned there stopped once it is reached again.

Exactly once: a workload requeued off a down cluster may still run there. Its members are ended in the store *and*
marked abandoned (`AllocationRow.abandoned_at`) in the same commit that requeues it: the intent survives a crash of
the hub. Once the cluster answers again, each abandoned launch it still runs is stopped (forced: a second copy of
the work must not go on), and the mark is cleared only when the cluster shows it gone. So at most one copy of an
attempt runs wherever the hub can see, and the copy it cannot see is stopped the moment it can."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.backends.base import Observed
from gpupool.backends.fleet import Health
from gpupool.lifecycle import transitions as lifecycle
from gpupool.lifecycle.phases import LIVE, AllocPhase, StopReason
from gpupool.models.clusters import ClusterStatus
from gpupool.store.tables import AllocationRow, ClusterRow, EventRow, WorkloadRow

log = logging.getLogger("gpupool.clusters")

SEEN_EVERY_S = 10.0
"""How often a reached cluster's `last_seen_at` is written (its status is written at once when it changes)."""


class FleetView(Protocol):
    """What this step asks of the hub's backend (gpupool.backends.fleet.Fleet)."""

    def spoke_health(self) -> dict[str, Health]: ...

    def cluster_of(self, node: str) -> str: ...

    def unreachable(self, node: str) -> bool: ...

    def stop(self, alloc_id: str, force: bool) -> None: ...

    def forget(self, alloc_id: str) -> None: ...


def fleet_of(backend: object) -> FleetView | None:
    """The backend as a fleet, where it is one (a leader's wrapper passes the question on)."""
    return backend if callable(getattr(backend, "spoke_health", None)) else None  # type: ignore[return-value]


class Clusters:
    def __init__(self, down_after_s: float) -> None:
        self.down_after_s = down_after_s

    def step(
        self,
        s: Session,
        fleet: FleetView,
        rows: Sequence[WorkloadRow],
        observed: Mapping[str, Observed] | None,
        now: float,
    ) -> list[EventRow]:
        health = fleet.spoke_health()
        if not health:  # no spoke: nothing to write or to move, and no query in every cycle of a single cluster
            return []
        down = self._heartbeats(s, health, now)
        events = _lost(rows, fleet, down, now)
        if observed is not None:
            _abandoned(s, fleet, observed)
        return events

    def _heartbeats(self, s: Session, health: Mapping[str, Health], now: float) -> dict[str, float]:
        """Write each spoke's status; returns the down ones and since when."""
        down: dict[str, float] = {}
        for row in s.scalars(select(ClusterRow)):
            h = health.get(row.name)
            if h is None:  # added a moment ago: this server has not begun to reach it
                continue
            if h.reached:
                if row.status != ClusterStatus.UP:
                    if row.status == ClusterStatus.DOWN:
                        log.warning("cluster %s is back after %.0fs down", row.name, now - (row.down_since or now))
                    row.status, row.down_since = ClusterStatus.UP.value, None
                    row.updated_at = now
                if h.last_seen is not None and now - (row.last_seen_at or 0.0) >= SEEN_EVERY_S:
                    row.last_seen_at = h.last_seen
                continue
            if not h.tried and row.status != ClusterStatus.DOWN:
                continue  # its first try is in flight (the try ends: its calls have timeouts)
            if row.status == ClusterStatus.DOWN:
                down[row.name] = row.down_since if row.down_since is not None else now
                continue
            # Counted from this server's own last reach (the row's is written only every SEEN_EVERY_S), or from when
            # it began to try: a hub that was down itself does not count that time against its spokes.
            unseen_since = h.last_seen if h.last_seen is not None else h.since
            if now - unseen_since >= self.down_after_s:
                log.warning("cluster %s is down: not reached for %.0fs (%s)", row.name, now - unseen_since, h.error)
                row.status, row.down_since, row.updated_at = ClusterStatus.DOWN.value, now, now
                down[row.name] = now
        return down


def _lost(rows: Sequence[WorkloadRow], fleet: FleetView, down: Mapping[str, float], now: float) -> list[EventRow]:
    """Workloads with members on a down cluster, past their policy (or already asked to stop, which nothing there
    can do now): their members there are ended and abandoned, and a workload not yet stopping is requeued."""
    events: list[EventRow] = []
    if not down:
        return events
    for row in rows:
        if row.state not in LIVE:
            continue
        there = [a for a in lifecycle.current(row) if a.state != AllocPhase.ENDED and fleet.cluster_of(a.node) in down]
        if not there:
            continue
        cluster = fleet.cluster_of(there[0].node)
        down_s = now - down[cluster]
        due = row.cluster_lost_after_s is not None and down_s >= row.cluster_lost_after_s
        if not due and row.stop_reason is None:
            continue
        if row.stop_reason is None:
            event = lifecycle.request_stop(row, StopReason.CLUSTER_LOST, now, cluster=cluster, down_s=round(down_s))
            if event is not None:
                events.append(event)
        for alloc in there:
            lifecycle.move_alloc(alloc, AllocPhase.ENDED)
            alloc.exit_code, alloc.abandoned_at = None, now
        log.warning("workload %d: %d member(s) abandoned on down cluster %s", row.id, len(there), cluster)
    return events


def _abandoned(s: Session, fleet: FleetView, observed: Mapping[str, Observed]) -> None:
    """Launches abandoned on a cluster that answers again: stopped where they still run, else their mark cleared."""
    for alloc in s.scalars(select(AllocationRow).where(AllocationRow.abandoned_at.is_not(None))):
        if fleet.unreachable(alloc.node):
            continue
        seen = observed.get(alloc.id)
        running = seen is not None and seen.alive
        try:
            if running:
                log.warning("stopping %s on cluster %s: its workload was requeued while the cluster was down",
                            alloc.id, fleet.cluster_of(alloc.node))  # fmt: skip
                fleet.stop(alloc.id, True)
            else:
                fleet.forget(alloc.id)
                alloc.abandoned_at = None
        except Exception as e:  # tried again next cycle: the mark stays until the cluster shows it gone
            log.warning("abandoned launch %s: %s", alloc.id, e)
