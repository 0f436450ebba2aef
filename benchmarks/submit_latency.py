"""Submit latency and throughput of a real gpupool server on an idle 8-GPU simulated host.

Starts `gpupool server --gpus fake:8xH100-80GB` on SQLite (or `--db URL`, or `--db postgresql` for a throwaway
PostgreSQL of its own) in a temp dir, with `--workers N` API processes (PostgreSQL only), then measures:

* latency: `--count` sequential submits of a 1-GPU workload whose process prints the wall clock as its first
  act (`date +%s.%N`); latency = that time minus the moment the submit call returned. Same host, same clock.
* throughput: `--burst` submits of 1-GPU workloads from `--clients` client processes as fast as the API takes
  them (a sweep: 8 start, the rest queue while the scheduler loop keeps running); submits per second over
  the whole burst.
* where the time went during the burst: CPU seconds of the server's processes, of PostgreSQL's (when it is the
  benchmark's own) and of the clients, against what the machine's cores could give over the burst.

Progress goes to stdout; the last line is one JSON object with p50_ms, p99_ms, submits_per_s and cpu_s.

    python benchmarks/submit_latency.py
    python benchmarks/submit_latency.py --count 50 --burst 200
    python benchmarks/submit_latency.py --db postgresql --workers 2 --burst 10000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx

from gpupool.client import Client
from gpupool.models.schemas import DepartmentCreate, ProjectCreate, WorkloadCreate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.e2e.postgres import Postgres

GPUPOOL = str(Path(sys.executable).parent / "gpupool")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(root: Path, db: str | None, single_user: bool, workers: int) -> tuple[subprocess.Popen[bytes], str, str]:
    port = _port()
    cmd = [GPUPOOL, "server", "--data-dir", str(root / "data"), "--port", str(port), "--gpus", "fake:8xH100-80GB"]
    cmd += ["--db", db] if db else []
    cmd += ["--single-user"] if single_user else []
    cmd += ["--workers", str(workers)] if workers > 1 else []
    log = open(root / "server.log", "wb")  # noqa: SIM115 - held for the server's life
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            time.sleep(0.05)
    token = (root / "data" / "admin-token").read_text().strip()
    return proc, url, token


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def latency(c: Client, count: int) -> list[float]:
    out: list[float] = []
    for i in range(count):
        w = c.submit(WorkloadCreate(project="bench", name=f"lat-{i}", gpus=1, command=["date", "+%s.%N"]))
        returned = time.time()
        deadline = time.monotonic() + 30
        while True:
            data, _, _ = c.logs(w.name)
            if data.strip():
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{w.name} did not start within 30 s")
            time.sleep(0.002)
        out.append((float(data.split()[0]) - returned) * 1000)
        if (i + 1) % 50 == 0:
            print(f"latency: {i + 1}/{count}, p50 so far {statistics.median(out):.1f} ms", flush=True)
    return out


def _submit_many(url: str, token: str, prefix: str, count: int) -> tuple[int, float]:
    """One client process: `count` sequential submits; returns how many failed and the CPU seconds it used. The
    bodies are encoded before the clock starts and sent with plain httpx, so the figure is the server's, not
    the client's."""
    bodies = [
        WorkloadCreate(
            project="bench", name=f"{prefix}-{i}", type="batch", gpus=1, command=["sleep", "3600"]
        ).model_dump_json(exclude_none=True)
        for i in range(count)
    ]
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    failed = 0
    cpu = time.process_time()
    with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
        for body in bodies:
            if http.post("/api/v1/workloads", content=body).status_code != 201:
                failed += 1
    return failed, time.process_time() - cpu


def throughput(url: str, token: str, burst: int, clients: int, watched: dict[str, list[int]]) -> dict[str, float]:
    """`clients` processes (not threads: one interpreter could not drive the server hard enough). Returns
    submits_per_s, the burst's seconds, and CPU seconds of each process tree in `watched` and of the clients."""
    per = burst // clients
    with ProcessPoolExecutor(clients) as pool:
        pool.submit(int).result()  # the workers are up before the clock starts
        before = {name: cpu_seconds(roots) for name, roots in watched.items()}
        start = time.perf_counter()
        results = pool.map(
            _submit_many, [url] * clients, [token] * clients, [f"tp{k}" for k in range(clients)], [per] * clients
        )
        # Each client keeps one connection for its whole share: whose they are says who served what.
        time.sleep(1.0)
        port = int(url.rsplit(":", 1)[1])
        held = {name: connections(port, roots) for name, roots in watched.items()}
        done = list(results)
        elapsed = time.perf_counter() - start
        after = {name: cpu_seconds(roots) for name, roots in watched.items()}
    failed = sum(f for f, _ in done)
    if failed:
        raise RuntimeError(f"{failed} submits failed")
    out = {"submits_per_s": per * clients / elapsed, "seconds": elapsed, "clients": sum(c for _, c in done)}
    out |= {f"{name}_connections": float(n) for name, n in held.items()}
    return out | {name: after[name] - before[name] for name in watched}


def connections(port: int, roots: list[int]) -> int:
    """Established TCP connections to `port` held by the processes under `roots`."""
    inodes: set[str] = set()
    for pid in _tree(roots):
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01" and fields[9] in inodes:
                    count += 1
    return count


def _leader_pid(db: str) -> int:
    import psycopg

    deadline = time.monotonic() + 30
    with psycopg.connect(db, autocommit=True) as conn:
        while True:
            row = conn.execute("SELECT holder FROM leases WHERE name = 'scheduler' AND expires_at > 0").fetchone()
            if row is not None:
                return int(str(row[0]).split(":")[-2])  # host:pid:random
            if time.monotonic() > deadline:
                raise RuntimeError("no server took the scheduler's lease within 30 s")
            time.sleep(0.1)


def _processes() -> dict[int, tuple[int, float]]:
    """pid → (parent pid, user and system CPU seconds), for every process alive now."""
    out: dict[int, tuple[int, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return out


def _tree(roots: list[int], procs: dict[int, tuple[int, float]] | None = None) -> list[int]:
    """The processes under `roots`, themselves included."""
    procs = _processes() if procs is None else procs
    out = []
    for pid in procs:
        p = pid
        while p > 1 and p not in roots:
            p = procs[p][0] if p in procs else 0
        if p in roots:
            out.append(pid)
    return out


def cpu_seconds(roots: list[int]) -> float:
    """User and system CPU seconds of the processes under `roots` (themselves included) that are alive now."""
    procs = _processes()
    return sum(procs[pid][1] for pid in _tree(roots, procs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--burst", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=4, help="client processes for the burst")
    ap.add_argument(
        "--db",
        default=None,
        help="postgresql://..., or postgresql for a throwaway one (default: SQLite in the temp dir)",
    )
    ap.add_argument("--workers", type=int, default=1, help="API worker processes (PostgreSQL only)")
    ap.add_argument("--single-user", action="store_true", help="no sandbox: what isolation costs")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gpupool-bench-"))
    pg: Postgres | None = None
    db = args.db
    if db == "postgresql":
        pg = Postgres(Path(tempfile.mkdtemp(prefix="gpupool-pg-")))  # not in a private dir: it runs as its own user
        pg.start()
        db = pg.new_database()
    try:
        _run(args, root, db, pg)
    finally:
        if pg is not None:
            pg.stop()
            shutil.rmtree(pg.root, ignore_errors=True)


def _run(args: argparse.Namespace, root: Path, db: str | None, pg: Postgres | None) -> None:
    proc, url, token = _start(root, db, args.single_user, args.workers)
    watched = {"server": [proc.pid]}
    if pg is not None:
        watched["postgresql"] = [int((pg.data / "postmaster.pid").read_text().split()[0])]
    if db is not None:
        watched["leader"] = [_leader_pid(db)]  # the process that runs the scheduler loop (and serves too)
    try:
        with Client(url, token) as c:
            c.create_department(DepartmentCreate(name="bench-dept", deserved_gpus=8))
            c.create_project(ProjectCreate(name="bench", department="bench-dept", deserved_gpus=8))
            lat = latency(c, args.count)
            print(f"latency: p50 {_pct(lat, 0.5):.1f} ms, p99 {_pct(lat, 0.99):.1f} ms", flush=True)
        burst = throughput(url, token, args.burst, args.clients, watched)
        rate = burst["submits_per_s"]
        print(f"throughput: {rate:.0f} submits/s", flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        for rec in (root / "data" / "run").glob("*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                os.killpg(int(json.loads(rec.read_text())["pid"]), signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)
    cores = os.cpu_count() or 1
    cpu = {name: round(burst[name], 1) for name in (*watched, "clients")}
    served = {name: int(burst[f"{name}_connections"]) for name in watched if name in ("server", "leader")}
    result = {
        "benchmark": "submit_latency",
        "store": "postgresql" if db else "sqlite",
        "workers": args.workers,
        "sandboxed": not args.single_user and os.geteuid() == 0,
        "count": args.count,
        "p50_ms": round(_pct(lat, 0.5), 1),
        "p99_ms": round(_pct(lat, 0.99), 1),
        "max_ms": round(max(lat), 1),
        "burst": args.burst,
        "clients": args.clients,
        "submits_per_s": round(rate, 1),
        "burst_s": round(burst["seconds"], 1),
        "cpu_s": cpu,
        "cpu_share": {name: round(v / (cores * burst["seconds"]), 2) for name, v in cpu.items()},
        "client_connections": served,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
