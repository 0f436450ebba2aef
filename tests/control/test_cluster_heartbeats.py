"""A spoke's status from the hub's heartbeats: a first try still in flight (a loaded hub building its client and
listing its pods) is not a spoke gone; a try that ended unreached counts from when this server began to try."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from gpupool.backends.base import Observed
from gpupool.backends.fleet import Health
from gpupool.control.clusters import Clusters
from gpupool.models.clusters import ClusterStatus
from gpupool.store.engine import session_factory
from gpupool.store.tables import ClusterRow

DOWN_AFTER_S = 3.0


@dataclass
class Fleet:
    health: dict[str, Health]
    stopped: list[str] = field(default_factory=list)

    def spoke_health(self) -> dict[str, Health]:
        return self.health

    def cluster_of(self, node: str) -> str:
        return node.split("/", 1)[0] if "/" in node else "home"

    def unreachable(self, node: str) -> bool:
        return False

    def stop(self, alloc_id: str, force: bool) -> None:
        self.stopped.append(alloc_id)

    def forget(self, alloc_id: str) -> None:
        pass


@pytest.fixture
def session(migrated_engine: Engine) -> Iterator[Session]:
    with session_factory(migrated_engine)() as s:
        s.add(ClusterRow(name="west", kind="kubernetes", status=ClusterStatus.UP.value, created_at=0.0, updated_at=0.0))
        s.commit()
        yield s


def _status(s: Session, fleet: Fleet, now: float) -> str:
    observed: dict[str, Observed] = {}
    Clusters(DOWN_AFTER_S).step(s, fleet, [], observed, now)
    row = s.get(ClusterRow, "west")
    assert row is not None
    return row.status


def test_a_spoke_whose_first_try_is_still_in_flight_is_not_down(session: Session) -> None:
    # This server began to reach it at 100 and has not heard back: 10 s later it is still not counted down.
    fleet = Fleet({"west": Health(False, None, 100.0, None, tried=False)})
    assert _status(session, fleet, 110.0) == ClusterStatus.UP
    # The try ends unreached: counted from when this server began to try.
    fleet.health["west"] = Health(False, None, 100.0, "connection refused", tried=True)
    assert _status(session, fleet, 110.0) == ClusterStatus.DOWN
    # Reached again: up.
    fleet.health["west"] = Health(True, 111.0, 100.0, None, tried=True)
    assert _status(session, fleet, 111.0) == ClusterStatus.UP


def test_a_spoke_unreached_since_its_last_reach_is_down_only_past_the_threshold(session: Session) -> None:
    fleet = Fleet({"west": Health(False, 100.0, 50.0, "timed out", tried=True)})
    assert _status(session, fleet, 100.0 + DOWN_AFTER_S - 0.5) == ClusterStatus.UP
    assert _status(session, fleet, 100.0 + DOWN_AFTER_S) == ClusterStatus.DOWN
