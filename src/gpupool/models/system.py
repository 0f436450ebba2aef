"""Wire models of the server's health and readiness, and of pools' settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpupool.models.wire import (
    Reply,
    Wire,
)


class Health(Reply):
    """/healthz: the server process answers (liveness); it says nothing of the store."""

    status: Literal["ok"]
    version: str


StoreState = Literal["ok", "unavailable", "unknown"]


SchedulerState = Literal["ok", "standby", "starting", "failing", "stalled", "stopped"]


class Readiness(Reply):
    """/readyz: whether this server should be sent traffic, and which part holds it back. 200 when ready, 503
    with the same body when not."""

    status: Literal["ready", "not ready"]
    store: StoreState
    """unknown: the store is not watched (an app served without its lifespan)."""
    scheduler: SchedulerState
    """standby: another replica leads and this one serves the API (ready); starting: no cycle has completed
    yet; failing: cycles have failed for a while; stalled: a cycle has run far too long; stopped: no loop."""


class PoolUpdate(Wire):
    """What an admin may set for a pool; a field left out keeps its value."""

    share_across_projects: bool | None = Field(None, strict=True)
    """Whether fractions of different projects may share one device of the pool. Their memory and compute
    are not isolated from each other, so pools do not allow it unless an admin says so."""


class PoolPublic(Reply):
    name: str
    nodes: int
    """Nodes that name this pool now."""
    gpus: int
    share_across_projects: bool
    updated_at: float | None
    """When an admin last changed its settings; null while it has the defaults."""
