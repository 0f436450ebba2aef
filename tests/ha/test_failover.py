"""Replicas on one PostgreSQL and one data dir: one leads and acts, a standby takes over a leader that was killed
or paused, runs what was running without starting it again, and a deposed leader acts no more. Real server
processes, a real PostgreSQL; the GPUs are simulated."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpupool.models.schemas import ProjectCreate
from tests.e2e.conftest import GPUPOOL, Server, wait_for
from tests.e2e.postgres import Postgres
from tests.ha.replicas import Replicas, Storm, long_running

TAKEOVER_S = 15.0
BIND = "gpupool.control: bind "


@pytest.fixture
def replicas(tmp_path: Path, postgres: Postgres) -> Iterator[Callable[..., Replicas]]:
    made: list[Replicas] = []

    def make(count: int, gpus: str, *args: str) -> Replicas:
        root = tmp_path / f"set{len(made)}"
        root.mkdir()
        r = Replicas.start(root, postgres.new_database(), count, gpus, args)
        made.append(r)
        with r.alive().client() as c:
            c.create_project(ProjectCreate(name="ha", deserved_gpus=8))
        return r

    yield make
    for r in made:
        r.close()


def _devices(r: Replicas, via: Server | None = None) -> list[int]:
    return sorted(d for _, devices in r.running(via).values() for d in devices)


def test_a_standby_takes_over_a_killed_leader_and_adopts_what_runs(replicas: Callable[..., Replicas]) -> None:
    r = replicas(2, "fake:8xH100-80GB")
    leader = r.leader()
    standby = next(s for s in r.servers if s is not leader)
    storm = Storm([s.url for s in r.servers], r.admin_token, count=24, pace_s=0.05).start()
    wait_for(lambda: len(r.running()) == 8 and len(storm.acknowledged) >= 12, 60, "8 running mid-storm")
    before = r.running()
    assert BIND not in standby.log()  # only the leader acts
    epoch = r.lease()[0]  # type: ignore[index]
    killed = time.monotonic()
    leader.kill()  # SIGKILL: no lease given up, no clean-up
    assert r.wait_for_new_leader(epoch, TAKEOVER_S) is standby
    assert time.monotonic() - killed < TAKEOVER_S
    storm.join(60)

    # Every acknowledged submit is in the store once, and nothing else is.
    assert sorted(r.names().items()) == sorted((name, 1) for name in storm.acknowledged)
    assert len(storm.acknowledged) == 24
    # What ran runs on, adopted: same devices, its process started once.
    wait_for(lambda: "took over the scheduler" in standby.log(), 10, "the new leader to adopt")
    after = r.running()
    assert {n: after.get(n) for n in before} == before
    assert [r.starts(wid) for wid, _ in before.values()] == [1] * 8
    # The new leader stops adopted work and starts queued work on the freed devices, each process once.
    with standby.client() as c:
        for name in sorted(before)[:4]:
            c.cancel(name)
    wait_for(lambda: len(set(r.running()) - set(before)) == 4, 30, "4 queued workloads to start")
    running = r.running()
    assert _devices(r) == list(range(8))  # no device given twice
    wait_for(lambda: all(r.starts(wid) for wid, _ in running.values()), 15, "each process to have started")
    assert [r.starts(wid) for wid, _ in running.values()] == [1] * 8
    with standby.client() as c:
        ids = [w.id for w in c.list_workloads()]
    assert max(r.starts(i) for i in ids) == 1


def test_a_paused_leader_is_deposed_and_acts_no_more_once_it_resumes(replicas: Callable[..., Replicas]) -> None:
    """SIGSTOP stands for a leader cut off from the store: its lease runs out, a standby takes it, and when it
    resumes its own clock tells it that it no longer leads (its cycles' commits are fenced besides: see
    test_lease), so it serves the API as a standby and sends its wake-ups to the new leader."""
    r = replicas(2, "fake:4xH100-80GB")
    old = r.leader()
    new = next(s for s in r.servers if s is not old)
    assert old.proc is not None
    with old.client() as c:
        for name in ("a1", "a2"):
            c.submit(long_running(name))
    wait_for(lambda: len(r.running()) == 2, 30, "a1 and a2 to run")
    epoch = r.lease()[0]  # type: ignore[index]
    os.kill(old.proc.pid, signal.SIGSTOP)
    paused = time.monotonic()
    assert r.wait_for_new_leader(epoch, TAKEOVER_S) is new
    assert time.monotonic() - paused < TAKEOVER_S
    with new.client() as c:
        c.cancel("a1")
        c.submit(long_running("b1"))
    wait_for(lambda: sorted(r.running(new)) == ["a2", "b1"], 30, "a1 cancelled and b1 running")

    mark = len(old.log())
    os.kill(old.proc.pid, signal.SIGCONT)
    wait_for(lambda: "no longer the leader" in old.log()[mark:], 15, "the old leader to learn it was deposed")
    with old.client() as c:  # it serves, as a standby: the new leader runs what it took
        c.submit(long_running("c1"))
    wait_for(lambda: "c1" in r.running(new), 15, "c1 to run")
    assert BIND not in old.log()[mark:]
    assert r.leader() is new
    running = r.running(new)
    assert sorted(running) == ["a2", "b1", "c1"]
    devices = _devices(r, new)
    assert len(set(devices)) == len(devices) == 3  # no device given twice
    # "running" is written when the process is launched; its first line may come a moment later.
    wait_for(lambda: all(r.starts(wid) for wid, _ in running.values()), 15, "each process to have started")
    assert [r.starts(wid) for wid, _ in running.values()] == [1, 1, 1]


def test_two_workers_serve_and_one_schedules(tmp_path: Path, postgres: Postgres) -> None:
    postgres_url = postgres.new_database()
    s = Server(tmp_path, postgres_url, "fake:4xH100-80GB", ("--single-user", "--workers", "2"))
    # A long interval: work starts at once only if a submit taken by the standby worker wakes the leader.
    s.args += ("--interval", "30")
    s.start()
    try:
        assert s.proc is not None
        pid = s.proc.pid
        workers = wait_for(lambda: w if len(w := _workers(pid)) == 2 else None, 30, "2 worker processes")
        r = Replicas(postgres_url, [s])
        wait_for(r.lease, 30, "a worker to take the lease")
        assert r.lease()[1] in workers  # type: ignore[index]
        with s.client() as c:
            c.create_project(ProjectCreate(name="ha", deserved_gpus=4))
            started = time.monotonic()
            for i in range(4):  # new connections: the kernel spreads them over both workers
                with s.client() as one:
                    one.submit(long_running(f"w{i}"))
        wait_for(lambda: len(r.running()) == 4, 10, "4 to run")
        assert time.monotonic() - started < 10  # well inside the 30 s interval
        assert _devices(r) == [0, 1, 2, 3]
    finally:
        s.kill(signal.SIGTERM)
        s.stop_workloads()


def test_workers_on_sqlite_are_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [GPUPOOL, "server", "--data-dir", str(tmp_path), "--gpus", "fake:1xH100-80GB", "--workers", "2"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == (
        "error: --workers 2 needs PostgreSQL (--db postgresql://...): SQLite has one writer at a time and one "
        "server per file, so run one worker on it\n"
    )


def _workers(pid: int) -> list[int]:
    """The server's worker processes (multiprocessing's resource tracker is a child too)."""
    try:
        children = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return [c for c in children if b"spawn_main" in _cmdline(c)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
