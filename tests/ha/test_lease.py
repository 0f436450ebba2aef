"""The leader's lease on real stores: one holder at a time, a new epoch for each new holder, a lease that ran out
taken over, and a deposed leader's cycle fenced so that none of it commits."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session, sessionmaker

from gpupool.control.leader import Deposed, Leadership
from gpupool.store import leases
from gpupool.store.engine import session_factory
from gpupool.store.tables import QueueRow
from tests.e2e.conftest import wait_for

TAKE_OVER = "UPDATE leases SET holder = 'b', epoch = epoch + 1, expires_at = expires_at + 3600 WHERE name = 'scheduler'"


@pytest.fixture
def sessions(migrated_engine: Engine) -> sessionmaker[Session]:
    return session_factory(migrated_engine)


def test_one_holder_at_a_time_and_each_new_holder_a_new_epoch(sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        assert leases.acquire(s, "scheduler", "a", 60) == 1
        s.commit()
        assert leases.acquire(s, "scheduler", "b", 60) is None
        assert leases.renew(s, "scheduler", "a", 1, 60) is True
        s.commit()
        leases.release(s, "scheduler", "a", 1)
        s.commit()
        assert leases.acquire(s, "scheduler", "b", 60) == 2
        s.commit()
        assert leases.renew(s, "scheduler", "a", 1, 60) is False
        assert leases.renew(s, "scheduler", "b", 2, 60) is True
        s.commit()


def test_a_lease_that_ran_out_is_taken_by_the_next(sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        assert leases.acquire(s, "scheduler", "a", 0.3) == 1
        s.commit()

    def take() -> int | None:
        with sessions() as s:
            got = leases.acquire(s, "scheduler", "b", 60)
            s.commit()
            return got

    assert wait_for(take, 10, "b to take the lease") == 2
    with sessions() as s:
        row = leases.current(s, "scheduler")
        assert row is not None and (row.holder, row.epoch) == ("b", 2)


def test_a_deposed_leaders_cycle_commits_nothing(sessions: sessionmaker[Session]) -> None:
    a = Leadership(sessions, ttl_s=5.0)
    a.start()
    try:
        wait_for(a.acting, 10, "a to lead")
        with sessions() as s:  # while a leads, its fenced commits go through
            s.add(QueueRow(name="kept", kind="project", policy={}, created_at=time.time()))
            a.fence(s)
            s.commit()
        # Another server takes the lease (as it would once a's ran out while a was cut off).
        with sessions() as s:
            s.execute(text(TAKE_OVER))
            s.commit()
        with sessions() as s:
            s.add(QueueRow(name="lost", kind="project", policy={}, created_at=time.time()))
            with pytest.raises(Deposed):
                a.fence(s)
            s.rollback()
        assert a.acting() is False
        with sessions() as s:
            assert list(s.scalars(select(QueueRow.name).order_by(QueueRow.name))) == ["kept"]
    finally:
        a.stop()
    with sessions() as s:  # a gave up nothing it no longer held
        row = leases.current(s, "scheduler")
        assert row is not None and (row.holder, row.epoch) == ("b", 2)
