"""Workload versions on SQLite and PostgreSQL: a reader that keeps a mark finds every write made since (a write in
flight at the mark included), and a writer finds out when a row moved since it read it."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from gpupool.lifecycle.phases import Phase
from gpupool.store import changes
from gpupool.store.engine import session_factory
from gpupool.store.tables import QueueRow, UserRow, WorkloadRow


@pytest.fixture
def engine(migrated_engine: Engine) -> Engine:
    return migrated_engine


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    made = session_factory(engine)
    with made() as s:
        s.add_all(
            [
                QueueRow(id=1, name="lab", kind="project", created_at=0.0),
                UserRow(id=1, name="ana", role="admin", created_at=0.0),
            ]
        )
        s.commit()
    return made


def _submit(s: Session, name: str) -> WorkloadRow:
    row = WorkloadRow(
        name=name, project_id=1, owner_id=1, type="batch", priority_class="batch", priority=50, preemptible=True,
        grace_s=1.0, state=Phase.PENDING.value, created_at=0.0, queued_at=0.0,
    )  # fmt: skip
    s.add(row)
    return row


def _since(sessions: sessionmaker[Session], mark: int) -> set[str]:
    with sessions() as s:
        return {r.name for r in changes.scheduled_rows(s, mark)}


def test_a_reader_finds_what_was_written_after_its_mark_and_not_before(sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        _submit(s, "old")
        s.commit()
        mark = changes.mark(s)
        _submit(s, "new")
        s.commit()
    assert _since(sessions, mark) == {"new"}


def test_a_write_in_flight_at_the_mark_is_found_once_it_commits(sessions: sessionmaker[Session]) -> None:
    with sessions() as writer, sessions() as reader:
        _submit(writer, "slow")
        writer.flush()  # written, not committed: the reader cannot see it yet
        mark = changes.mark(reader)
        reader.commit()
        writer.commit()
    assert _since(sessions, mark) == {"slow"}


def test_every_write_through_the_orm_stamps_a_new_version(sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        row = _submit(s, "job")
        s.commit()
        first = row.version
        row.priority = 60
        s.commit()
        assert row.version > first
        mark = changes.mark(s)
    assert _since(sessions, mark) == set()


def test_a_claim_fails_for_a_row_written_since_it_was_read(sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        kept, moved = _submit(s, "kept"), _submit(s, "moved")
        s.commit()
        read = {kept.id: kept.version, moved.id: moved.version}
    with sessions() as other:
        row = other.get(WorkloadRow, moved.id)
        assert row is not None
        row.state = Phase.CANCELLED.value
        other.commit()
    with sessions() as s:
        assert changes.claim(s, read) == {kept.id}


def test_a_queued_workloads_reason_is_written_without_a_stamp_unless_the_row_moved(
    sessions: sessionmaker[Session],
) -> None:
    with sessions() as s:
        waits, cancelled = _submit(s, "waits"), _submit(s, "cancelled")
        s.commit()
        seen = {waits.id: waits.version, cancelled.id: cancelled.version}
        cancelled.state = Phase.CANCELLED.value
        s.commit()
        mark = changes.mark(s)
        notes = [
            {"wid": wid, "seen": version, "reason_event": "queued", "reason_code": "no-node-fits",
             "reason_args": {"detail": "full"}, "nominated": ["n1"]}
            for wid, version in seen.items()
        ]  # fmt: skip
        changes.note_waiting(s, notes)
        s.commit()
    assert _since(sessions, mark) == set()
    with sessions() as s:
        got = {r.name: (r.reason_code, r.reason_args, r.nominated, r.version) for r in s.scalars(select(WorkloadRow))}
    assert got["waits"] == ("no-node-fits", {"detail": "full"}, ["n1"], seen[waits.id])
    assert got["cancelled"][:3] == (None, {}, [])
