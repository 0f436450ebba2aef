"""Following a member's log: everything from the offset to the end, then the stream ends; it ends too when a
policy holds the workload or the caller's rights go, and waits (without a thread) while nothing comes."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpupool.backends.local.backend import LocalBackend
from gpupool.backends.local.gpus import discover
from gpupool.lifecycle.phases import Phase
from gpupool.services.logs import follow
from gpupool.store.engine import make_engine, migrate, session_factory
from gpupool.store.tables import QueueRow, UserRow, WorkloadRow

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def store(tmp_path: Path) -> sessionmaker[Session]:
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    migrate(engine)
    sessions = session_factory(engine)
    with sessions() as s:
        s.add(QueueRow(id=1, name="lab", kind="project", created_at=0, policy={}))
        s.add(UserRow(id=1, name="ana", role="member", created_at=0))
        s.add(WorkloadRow(
            id=1, name="job", project_id=1, owner_id=1, type="training", priority_class="training", priority=50,
            preemptible=True, grace_s=30, state=Phase.RUNNING, created_at=0, queued_at=0, allocations=[],
        ))  # fmt: skip
        s.commit()
    return sessions


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(tmp_path / "data", "host", "default", discover("fake:1xH100-80GB"))


def _write(backend: LocalBackend, text: bytes) -> None:
    path = Path(backend.log_path(1, 0))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as f:
        f.write(text)


def _set(store: sessionmaker[Session], **values: object) -> None:
    with store() as s:
        row = s.get(WorkloadRow, 1)
        assert row is not None
        for k, v in values.items():
            setattr(row, k, v)
        s.commit()


async def _collect(store: sessionmaker[Session], backend: LocalBackend, allowed: list[bool], offset: int = 0) -> bytes:
    out = b""
    stream = follow(store, backend, 1, 0, offset, allowed=lambda: allowed[0], recheck_s=0.0, poll_s=0.01)
    with anyio.fail_after(30):
        async for data in stream:
            out += data
            if out.endswith(b"two\n"):
                _write(backend, b"three\n")
                _set(store, state=Phase.SUCCEEDED)  # it ends after writing its last line
    return out


async def test_a_followed_log_runs_from_the_offset_to_the_end(
    store: sessionmaker[Session], backend: LocalBackend
) -> None:
    _write(backend, b"one\ntwo\n")
    assert await _collect(store, backend, [True], offset=4) == b"two\nthree\n"


async def test_a_held_workload_ends_its_stream(store: sessionmaker[Session], backend: LocalBackend) -> None:
    _write(backend, b"idle\n")
    _set(store, state=Phase.SUSPENDED, hold=True)
    assert await _collect(store, backend, [True]) == b"idle\n"


async def test_a_caller_whose_rights_went_stops_receiving(store: sessionmaker[Session], backend: LocalBackend) -> None:
    _write(backend, b"secret\n")
    assert await _collect(store, backend, [False]) == b"secret\n"  # what it could read; then nothing more
