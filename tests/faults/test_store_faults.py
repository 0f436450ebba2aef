"""The store failing under a running server: PostgreSQL stopped and hung, SQLite read-only and on a full disk.

While the store is down every request that needs it gets 503 with Retry-After within 2 s, /healthz stays 200 and
/readyz says 503 and why; the log holds one warning and one info line for the whole outage, not a traceback per
request; once the store is back everything works again without a restart, and every submit that was
acknowledged is in the store, once. A submitter runs through each fault, as clients would.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from gpupool.api.outage import store_fault
from gpupool.api.routers.system import scheduler_state
from gpupool.client import ApiError
from gpupool.control.loop import LoopHealth
from gpupool.models.schemas import ProjectCreate
from gpupool.models.system import Readiness
from gpupool.store.engine import make_engine
from tests.e2e.conftest import Server, Servers, wait_for
from tests.e2e.postgres import Postgres, _bin
from tests.faults.conftest import check_invariants, kill_members
from tests.store.test_engine import tmpfs

ANSWER_WITHIN_S = 2.0
OUTAGE = "the store is unavailable"
BACK = "the store answers again"
SUBMIT = {"project": "p", "gpus": 1, "command": ["sleep", "600"]}


class Submitter:
    """Submits from a thread of its own, each with an Idempotency-Key, as a client would through a fault; keeps
    the acknowledged ones (key to workload id) and each answer's status and time."""

    def __init__(self, s: Server) -> None:
        self.http = httpx.Client(base_url=s.url, headers={"Authorization": f"Bearer {s.admin_token}"}, timeout=30)
        self.acked: dict[str, int] = {}
        self.answers: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            key = f"storm-{n}"
            started = time.monotonic()
            r = self.http.post("/api/v1/workloads", json=SUBMIT, headers={"Idempotency-Key": key})
            self.answers.append((r.status_code, time.monotonic() - started))
            if r.status_code == 201:
                self.acked[key] = int(r.json()["id"])
            self._stop.wait(0.02)

    def __enter__(self) -> Submitter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        self.http.close()


@contextlib.contextmanager
def started(tmp_path: Path, db_url: str | None, *args: str) -> Iterator[Server]:
    servers = Servers(tmp_path)
    try:
        s = servers.start(db_url, "fake:1xH100-80GB", args)
        s.client().create_project(ProjectCreate(name="p", deserved_gpus=1))
        wait_for(lambda: s.client().ready().status == "ready", 30, "the server to be ready")
        assert s.client().ready() == Readiness(status="ready", store="ok", scheduler="ok")
        yield s
    finally:
        servers.close()
        for s in servers.started:
            kill_members(s.data_dir)


def refused_in_time(s: Server) -> float:
    """Waits for the first 503 (with Retry-After) and returns how long it took; then checks that every kind of
    request gets one, each within ANSWER_WITHIN_S, while /healthz answers and /readyz says the store is down."""
    auth = {"Authorization": f"Bearer {s.admin_token}"}
    began = time.monotonic()
    with httpx.Client(base_url=s.url, headers=auth, timeout=30) as http:
        wait_for(lambda: http.get("/api/v1/workloads").status_code == 503, 10, "a 503")
        first = time.monotonic() - began
        for method, path, body in [
            ("GET", "/api/v1/workloads", None),
            ("POST", "/api/v1/workloads", SUBMIT),
            ("GET", "/api/v1/whoami", None),
            ("GET", "/metrics", None),
        ] * 3:
            asked = time.monotonic()
            r = http.request(method, path, json=body)
            took = time.monotonic() - asked
            assert (r.status_code, r.headers.get("retry-after"), took < ANSWER_WITHIN_S) == (503, "1", True), (
                method, path, r.status_code, r.text, took,
            )  # fmt: skip
            assert r.json() == {"detail": "the store is unavailable; retry later"}
        asked = time.monotonic()
        assert http.get("/healthz").status_code == 200
        assert time.monotonic() - asked < 0.5
        r = http.get("/readyz")
        assert (r.status_code, r.json()["status"], r.json()["store"]) == (503, "not ready", "unavailable")
    return first


def refused_many(storm: Submitter, n: int = 50) -> None:
    """Holds the fault until the submitter has been refused `n` times: an outage long enough to flood a log."""
    wait_for(lambda: sum(status == 503 for status, _ in storm.answers) >= n, 30, f"{n} submits refused")


def recovered(s: Server) -> float:
    """Waits until the store answers and the server is ready again; returns how long the first took."""
    began = time.monotonic()

    def answers() -> bool:
        try:
            s.client().list_workloads(project="p")
        except ApiError as e:
            assert e.status == 503, e
            return False
        return True

    wait_for(answers, 30, "the store to answer")
    back = time.monotonic() - began
    wait_for(lambda: s.client().ready().status == "ready", 30, "the server to be ready again")
    return back


def outage_logged_once(s: Server) -> None:
    log = s.log()
    counts = (log.count(OUTAGE), log.count(BACK), log.count("Exception in ASGI application"))
    assert counts == (1, 1, 0), log[-4000:]


def survives(tmp_path: Path, db_url: str, fault: Callable[[Server], object], repair: Callable[[], object]) -> str:
    """Runs a server with a submitter through `fault` and `repair`, checks what every fault must leave, and
    returns the figures: time to the first 503, slowest 503, time from the repair to the first answer."""
    with started(tmp_path, db_url) as s, Submitter(s) as storm:
        wait_for(lambda: len(storm.acked) >= 3, 30, "some acknowledged submits")
        fault(s)
        try:
            first = refused_in_time(s)
            refused_many(storm)
        finally:
            repair()
        back = recovered(s)
        wait_for(lambda: len(storm.acked) >= 6, 30, "submits acknowledged after the outage")
    slowest = max(took for status, took in storm.answers if status == 503)
    assert slowest < ANSWER_WITHIN_S
    outage_logged_once(s)
    check_invariants(s, storm.acked)
    return f"first 503 after {first:.2f} s, slowest 503 {slowest:.2f} s, answering {back:.2f} s after the repair"


def _error(url: str, sql: str) -> Exception:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS t (x INTEGER PRIMARY KEY)")
            conn.exec_driver_sql(sql)
    except Exception as e:
        return e
    finally:
        engine.dispose()
    raise AssertionError(f"{sql} did not fail")


def test_only_errors_of_the_store_itself_are_answered_503(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens there once the socket is closed
    errors = {
        "statement": _error(db, "SELECT * FROM missing"),
        "constraint": _error(db, "INSERT INTO t VALUES (1), (1)"),
        "no server": _error(f"postgresql://postgres@127.0.0.1:{closed}/none", "SELECT 1"),
    }
    assert {what: store_fault(e) for what, e in errors.items()} == {
        "statement": False,
        "constraint": False,
        "no server": True,
    }


@pytest.mark.parametrize(
    ("health", "state"),
    [
        (LoopHealth(running=False, leader=True, last_ok_at=99.0, failing_since=None), "stopped"),
        (LoopHealth(running=True, leader=True, last_ok_at=None, failing_since=None), "starting"),
        (LoopHealth(running=True, leader=True, last_ok_at=99.0, failing_since=None), "ok"),
        (LoopHealth(running=True, leader=False, last_ok_at=99.0, failing_since=None), "standby"),
        (LoopHealth(running=True, leader=True, last_ok_at=90.0, failing_since=98.5), "ok"),  # 1.5 s of 2
        (LoopHealth(running=True, leader=True, last_ok_at=90.0, failing_since=97.5), "failing"),
        (LoopHealth(running=True, leader=False, last_ok_at=None, failing_since=90.0), "failing"),
        (LoopHealth(running=True, leader=True, last_ok_at=60.0, failing_since=None), "stalled"),  # 40 s of 30
    ],
)
def test_readiness_names_the_state_of_the_scheduler_loop(health: LoopHealth, state: str) -> None:
    """At 100 s on the loop's clock, with cycles every 0.5 s: failing for over 2 s (three intervals, 2 s at
    least), stalled after 30 s without a cycle ending (ten intervals, 30 s at least)."""
    assert scheduler_state(health, 0.5, 100.0) == state


# -- PostgreSQL ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[Postgres]:
    """A PostgreSQL server these tests alone stop and hang (the session's serves other tests meanwhile)."""
    root = Path(tempfile.mkdtemp(prefix="gpupool-pg-faults-"))
    pg = Postgres(root)
    pg.start()
    try:
        yield pg
    finally:
        with contextlib.suppress(Exception):
            signal_all(pg, signal.SIGCONT)
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


def start_again(pg: Postgres) -> None:
    """Starts a stopped server on its data dir and port as before."""
    opts = f"-p {pg.port} -k {pg.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300"
    run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    cmd = [*run_as, _bin("pg_ctl"), "-D", str(pg.data), "-o", opts, "-l", str(pg.root / "log"), "-w", "start"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)


def signal_all(pg: Postgres, sig: signal.Signals) -> None:
    """The postmaster and every process it started: SIGSTOP hangs the server while its kernel still acknowledges
    every packet, so no keepalive or TCP timeout on the client's side notices."""
    postmaster = psutil.Process(int((pg.data / "postmaster.pid").read_text().split()[0]))
    for p in [postmaster, *postmaster.children(recursive=True)]:
        p.send_signal(sig)


def test_a_stopped_postgresql_is_answered_503_then_used_again_once_it_is_back(
    tmp_path: Path, own_postgres: Postgres
) -> None:
    figures = survives(
        tmp_path, own_postgres.new_database(), lambda _s: own_postgres.stop(), lambda: start_again(own_postgres)
    )
    print(f"postgresql stopped: {figures}")


def test_a_hung_postgresql_does_not_hang_requests(tmp_path: Path, own_postgres: Postgres) -> None:
    figures = survives(
        tmp_path,
        own_postgres.new_database(),
        lambda _s: signal_all(own_postgres, signal.SIGSTOP),
        lambda: signal_all(own_postgres, signal.SIGCONT),
    )
    print(f"postgresql hung: {figures}")


# -- SQLite on a small tmpfs ---------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "store", "16m") as where:
        yield where


def integrity(db: Path) -> str:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


def test_sqlite_made_read_only_recovers_by_itself(tmp_path: Path, small_disk: Path) -> None:
    """A connection opened while the file is read-only stays read-only for life, and the pool must not keep it.
    As root, `chattr +i` is what a read-only file is to anyone else (chmod binds no root)."""
    db = small_disk / "gpupool.db"
    figures = survives(
        tmp_path,
        f"sqlite:///{db}",
        lambda _s: subprocess.run(["chattr", "+i", str(db)], check=True),
        lambda: subprocess.run(["chattr", "-i", str(db)], check=True),
    )
    print(f"sqlite read-only: {figures}")
    assert integrity(db) == "ok"


def test_sqlite_on_a_full_disk_refuses_writes_and_recovers_once_space_is_freed(
    tmp_path: Path, small_disk: Path
) -> None:
    db = small_disk / "gpupool.db"

    def fill(s: Server) -> None:
        """Until a submit is refused: an empty WAL must grow with the next write, so checkpoint it to nothing
        (another writer may be in the way: try again), then take every free byte."""
        with httpx.Client(base_url=s.url, headers={"Authorization": f"Bearer {s.admin_token}"}, timeout=30) as http:

            def refused() -> bool:
                with contextlib.closing(sqlite3.connect(db)) as conn:
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                with contextlib.suppress(OSError), open(small_disk / "filler", "ab") as f:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                return http.post("/api/v1/workloads", json=SUBMIT).status_code == 503

            wait_for(refused, 30, "a submit refused")

    figures = survives(tmp_path, f"sqlite:///{db}", fill, (small_disk / "filler").unlink)
    print(f"sqlite disk full: {figures}")
    assert integrity(db) == "ok"


def test_a_truncated_shm_file_is_a_bus_error_the_log_shows_and_a_restart_recovers_from(
    tmp_path: Path, small_disk: Path
) -> None:
    """SQLite maps its -shm file: cut short under a live server (by another program) it kills the process with
    SIGBUS, which no handler can survive. The log says so, with the stack, and a restart loses nothing."""
    db = small_disk / "gpupool.db"
    with started(tmp_path, f"sqlite:///{db}") as s:
        with Submitter(s) as storm:
            wait_for(lambda: len(storm.acked) >= 3, 30, "some acknowledged submits")
        os.truncate(small_disk / "gpupool.db-shm", 0)
        proc = s.proc
        assert proc is not None
        wait_for(lambda: proc.poll() is not None, 30, "the server to die")
        assert (proc.returncode, "Fatal Python error: Bus error" in s.log()) == (-signal.SIGBUS, True)
        s.proc = None
        s.start()
        wait_for(lambda: s.client().ready().status == "ready", 30, "the restarted server to be ready")
        assert integrity(db) == "ok"
        check_invariants(s, storm.acked)
