"""A soak: a real gpupool server under a steady mix of work for a long time; does it leak or start failing?

Starts `gpupool server --gpus fake:4xH100-80GB` in a temp dir (SQLite, `--db URL`, or `--db postgresql` for a
throwaway PostgreSQL of its own) and drives it for `--minutes` with, every second: `--submits` short workloads
(a quarter GPU each, running 1-3 s), `--lists` pages of running and pending workloads, as many describes, and a
cancel of a recent workload every other second (running, pending, or already ended: a 409 is an answer, not
an error). Every `--sample-s` seconds it records the server process's RSS, open file descriptors and threads.

Errors are requests that got no answer, a 5xx, or a 4xx other than a cancel's 409; the server's log is counted
for ERROR lines and tracebacks too. Progress goes to stdout; the last line is one JSON object: start, end and
max of rss_mib, fds and threads, the count of each operation with its p50/p99 milliseconds, and the errors.

    python benchmarks/soak.py                  # 30 minutes on SQLite
    python benchmarks/soak.py --minutes 3 --db postgresql
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from gpupool.client import Client
from gpupool.client.client import ApiError
from gpupool.models.schemas import ProjectCreate, WorkloadCreate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.e2e.conftest import Server
from tests.e2e.postgres import Postgres
from tests.faults.conftest import kill_members


class Driver:
    """Runs each operation at its own steady rate on a thread of its own; counts, times and errors."""

    def __init__(self, url: str, token: str, seed: int) -> None:
        self.url, self.token = url, token
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ms: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.first_errors: list[str] = []
        self.recent: list[str] = []

    def _timed(self, op: str, call: Callable[[], Any], expected: tuple[int, ...] = ()) -> Any:
        started = time.perf_counter()
        try:
            out = call()
        except ApiError as e:
            if e.status in expected:
                out = None
            else:
                with self.lock:
                    self.errors[op] += 1
                    if len(self.first_errors) < 10:
                        self.first_errors.append(f"{op}: {e}")
                return None
        with self.lock:
            self.ms[op].append((time.perf_counter() - started) * 1000)
        return out

    def _every(self, period_s: float, step: Callable[[Client], None]) -> None:
        with Client(self.url, self.token, timeout=30) as c:
            next_at = time.monotonic()
            while not self.stop.is_set():
                step(c)
                next_at += period_s
                self.stop.wait(max(0.0, next_at - time.monotonic()))

    def submit(self, c: Client) -> None:
        seconds = self.rng.uniform(1, 3)
        body = WorkloadCreate(project="soak", gpu=0.25, command=["sleep", f"{seconds:.2f}"])
        w = self._timed("submit", lambda: c.submit(body))
        if w is not None:
            with self.lock:
                self.recent = [*self.recent[-19:], w.name]

    def list_pages(self, c: Client) -> None:
        self._timed("list", lambda: c.list_workloads(project="soak", state="running", limit=100))
        self._timed("list", lambda: c.list_workloads(project="soak", state="pending", limit=100))

    def describe(self, c: Client) -> None:
        with self.lock:
            name = self.rng.choice(self.recent) if self.recent else None
        if name is not None:
            self._timed("describe", lambda: c.describe(name, project="soak"))

    def cancel(self, c: Client) -> None:
        with self.lock:
            name = self.rng.choice(self.recent) if self.recent else None
        if name is not None:
            self._timed("cancel", lambda: c.cancel(name, project="soak"), expected=(409,))

    def run(self, submits: float, lists: float) -> list[threading.Thread]:
        plan: list[tuple[float, Callable[[Client], None]]] = [
            (1 / submits, self.submit),
            (1 / lists, self.list_pages),
            (1 / lists, self.describe),
            (2.0, self.cancel),
        ]
        threads = [threading.Thread(target=self._every, args=p, daemon=True) for p in plan]
        for t in threads:
            t.start()
        return threads


def sample(proc: psutil.Process) -> dict[str, float]:
    with proc.oneshot():
        rss_mib = round(proc.memory_info().rss / 2**20, 1)
        return {"rss_mib": rss_mib, "fds": proc.num_fds(), "threads": proc.num_threads()}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))], 1) if ordered else 0.0


def summary(samples: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {
        k: {"start": samples[0][k], "end": samples[-1][k], "max": max(s[k] for s in samples)}
        for k in ("rss_mib", "fds", "threads")
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--db", help="a PostgreSQL URL, or 'postgresql' for a throwaway one (default: SQLite)")
    ap.add_argument("--submits", type=float, default=2.0, help="submits per second")
    ap.add_argument("--lists", type=float, default=2.0, help="list pages (and describes) per second")
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="gpupool-soak-"))
    pg: Postgres | None = None
    db = args.db
    if db == "postgresql":
        pg = Postgres(Path(tempfile.mkdtemp(prefix="gpupool-soak-pg-")))
        pg.start()
        db = pg.new_database()
    server = Server(root, db, "fake:4xH100-80GB", ())
    try:
        server.start()
        assert server.proc is not None
        proc = psutil.Process(server.proc.pid)
        server.client().create_project(ProjectCreate(name="soak", deserved_gpus=4))
        driver = Driver(server.url, server.admin_token, args.seed)
        started = time.monotonic()
        samples = [sample(proc)]
        print(f"soak: {args.minutes:g} min against {server.url} ({'PostgreSQL' if db else 'SQLite'}); {samples[0]}")
        threads = driver.run(args.submits, args.lists)
        end = started + args.minutes * 60
        while time.monotonic() < end:
            time.sleep(min(args.sample_s, max(0.0, end - time.monotonic())))
            samples.append(sample(proc))
            with driver.lock:
                done = {op: len(v) for op, v in driver.ms.items()}
                errors = sum(driver.errors.values())
            print(f"{time.monotonic() - started:7.0f} s  {samples[-1]}  ops {done}  errors {errors}", flush=True)
        driver.stop.set()
        for t in threads:
            t.join(timeout=60)
        log = server.log()
        out = {
            "benchmark": "soak",
            "date": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_implementation()} "
            f"{platform.python_version()}",
            "db": "postgresql" if db else "sqlite",
            "minutes": args.minutes,
            "samples": len(samples),
            **summary(samples),
            "ops": {op: {"n": len(v), "p50_ms": _pct(v, 0.5), "p99_ms": _pct(v, 0.99)} for op, v in driver.ms.items()},
            "errors": sum(driver.errors.values()),
            "errors_by_op": dict(driver.errors),
            "first_errors": driver.first_errors,
            "server_log_errors": sum(" ERROR " in line or line.startswith("Traceback") for line in log.splitlines()),
        }
        print(json.dumps(out))
    finally:
        server.kill()
        kill_members(server.data_dir)
        if pg is not None:
            pg.stop()
            shutil.rmtree(pg.root, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
