"""Migration 0007 turns stored sentences into codes: old stops keep counting as evictions under their code."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select, text

from gpupool.lifecycle.events import EventCode, render
from gpupool.store.engine import make_engine, migrate, session_factory
from gpupool.store.tables import EventRow, WorkloadRow
from tests.e2e.postgres import Postgres
from tests.store.revisions import at_revision

OLD_EVENTS = [
    ("submitted by ana", EventCode.NOTE, None, {"text": "submitted by ana"}),
    ("reclaim: reclaimed for 'big' of project a; stopping", EventCode.STOP_REQUESTED, "reclaim",
     {"detail": "reclaimed for 'big' of project a"}),
    ("idle for 6m40s (limit 5m); stopping", EventCode.STOP_REQUESTED, "idle", {"text": "idle for 6m40s (limit 5m)"}),
    ("ran for 1h (limit 1h); stopping", EventCode.STOP_REQUESTED, "max-runtime", {"text": "ran for 1h (limit 1h)"}),
    ("cancelled by ana; stopping", EventCode.NOTE, None, {"text": "cancelled by ana; stopping"}),
]  # fmt: skip


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_old_events_become_codes_that_read_as_before(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    else:
        pg: Postgres = request.getfixturevalue("postgres")
        url = pg.new_database()
    engine = make_engine(url)
    with at_revision(engine, "0006") as conn:
        conn.execute(
            text(
                "INSERT INTO queues (id, name, kind, strict_fifo, policy, created_at) "
                "VALUES (1, 'lab', 'project', false, '{}', 0)"
            )
        )
        conn.execute(text("INSERT INTO users (id, name, role, created_at) VALUES (1, 'ana', 'member', 0)"))
        conn.execute(text(
            "INSERT INTO workloads (id, name, project_id, owner_id, type, priority_class, priority, preemptible, "
            "min_runtime_s, gpus, gpu_milli, gpu_memory_mib, cpu_milli, memory_mib, workers, pools, command, env, "
            "grace_s, state, reason_code, reason, attempt, nominated, hold, created_at, queued_at) VALUES "
            "(1, 'w', 1, 1, 'training', 'training', 50, true, 0, 1, 0, 0, 0, 0, 1, '[]', '[]', '{}', 30, "
            "'pending', 'no-node-fits', 'no node in h100 has 1 GPU', 0, '[]', false, 0, 0)"
        ))  # fmt: skip
        for i, (old, *_rest) in enumerate(OLD_EVENTS):
            conn.execute(
                text("INSERT INTO events (workload_id, at, state, reason) VALUES (1, :at, 'running', :r)"),
                {"at": i, "r": old},
            )
    migrate(engine)
    with session_factory(engine)() as s:
        events = s.scalars(select(EventRow).order_by(EventRow.id)).all()
        assert [(e.code, e.reason_code, e.args) for e in events] == [tuple(x[1:]) for x in OLD_EVENTS]
        assert [render(e.code, e.reason_code, e.args) for e in events] == [x[0] for x in OLD_EVENTS]
        row = s.get(WorkloadRow, 1)
        assert row is not None
        assert (row.reason_event, row.reason_code, row.reason_args) == (
            EventCode.NOTE, "no-node-fits", {"text": "no node in h100 has 1 GPU"},
        )  # fmt: skip
        assert render(row.reason_event, row.reason_code, row.reason_args) == "no node in h100 has 1 GPU"
