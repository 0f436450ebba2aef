"""A rented (burst) node's lifecycle, and the only way its phase changes. Persisted as the enums' string values.

Each step that reaches the provider has a phase written *before* it, so that a hub restarted after a crash tells
"done", "maybe done" and "not done" apart: a node `asking` may or may not have been asked for (asked again: the
ask is idempotent by its name), one `releasing` may or may not have been given back (given back again, also
idempotent); a node with no row was never asked for."""

from __future__ import annotations

from gpupool.lifecycle.phases import BurstEnd, BurstPhase
from gpupool.lifecycle.transitions import IllegalTransition
from gpupool.store.tables import BurstNodeRow

_NEXT: dict[BurstPhase, frozenset[BurstPhase]] = {
    BurstPhase.ASKING: frozenset({BurstPhase.PROVISIONING, BurstPhase.RELEASING}),
    BurstPhase.PROVISIONING: frozenset({BurstPhase.READY, BurstPhase.RELEASING}),
    BurstPhase.READY: frozenset({BurstPhase.RELEASING}),
    BurstPhase.RELEASING: frozenset({BurstPhase.RELEASED}),
    BurstPhase.RELEASED: frozenset(),
}


def phase(row: BurstNodeRow) -> BurstPhase:
    return BurstPhase(row.phase)


def _move(row: BurstNodeRow, to: BurstPhase) -> None:
    was = phase(row)
    if to not in _NEXT[was]:
        raise IllegalTransition(f"burst node {row.name}: {was} → {to}")
    row.phase = to.value


def asking(name: str, cluster: str, department: str, gpus: int, price_micro: int, for_workloads: list[int],
           now: float) -> BurstNodeRow:  # fmt: skip
    """The intent to ask for one node, to be committed before the ask."""
    return BurstNodeRow(
        name=name, cluster=cluster, department=department, gpus=gpus, price_micro=price_micro,
        phase=BurstPhase.ASKING.value, for_workloads=for_workloads, asked_at=now,
    )  # fmt: skip


def asked(row: BurstNodeRow) -> None:
    """The provider has the request."""
    _move(row, BurstPhase.PROVISIONING)


def ready(row: BurstNodeRow, node: str, now: float) -> None:
    """Provisioned, and `node` attributed to it; empty until work lands on it."""
    _move(row, BurstPhase.READY)
    row.node, row.ready_at, row.idle_since = node, now, now


def release(row: BurstNodeRow, why: BurstEnd, message: str | None = None) -> None:
    """The intent to give it back, to be committed before the provider is told."""
    _move(row, BurstPhase.RELEASING)
    row.end_reason, row.idle_since = why.value, None
    if message:
        row.message = message[:1000]


def released(row: BurstNodeRow, now: float) -> None:
    """The provider confirmed it gone: its bill ends now."""
    _move(row, BurstPhase.RELEASED)
    row.released_at = now
