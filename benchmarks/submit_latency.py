"""Submit latency and throughput of a real gpupool server on an idle 8-GPU simulated host.

Starts `gpupool server --gpus fake:8xH100-80GB` on SQLite (or `--db URL`) in a temp dir, then measures:

* latency: `--count` sequential submits of a 1-GPU workload whose process prints the wall clock as its first
  act (`date +%s.%N`); latency = that time minus the moment the submit call returned. Same host, same clock.
* throughput: `--burst` submits of 1-GPU workloads from `--clients` client processes as fast as the API takes
  them (a sweep: 8 start, the rest queue while the scheduler loop keeps running); submits per second over
  the whole burst.

Progress goes to stdout; the last line is one JSON object with p50_ms, p99_ms and submits_per_s.

    python benchmarks/submit_latency.py
    python benchmarks/submit_latency.py --count 50 --burst 200
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

GPUPOOL = str(Path(sys.executable).parent / "gpupool")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(root: Path, db: str | None, single_user: bool) -> tuple[subprocess.Popen[bytes], str, str]:
    port = _port()
    cmd = [GPUPOOL, "server", "--data-dir", str(root / "data"), "--port", str(port), "--gpus", "fake:8xH100-80GB"]
    cmd += ["--db", db] if db else []
    cmd += ["--single-user"] if single_user else []
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


def _submit_many(url: str, token: str, prefix: str, count: int) -> int:
    """One client process: `count` sequential submits; returns how many failed. The bodies are encoded
    before the clock starts and sent with plain httpx, so the figure is the server's, not the client's."""
    bodies = [
        WorkloadCreate(
            project="bench", name=f"{prefix}-{i}", type="batch", gpus=1, command=["sleep", "3600"]
        ).model_dump_json(exclude_none=True)
        for i in range(count)
    ]
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    failed = 0
    with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
        for body in bodies:
            if http.post("/api/v1/workloads", content=body).status_code != 201:
                failed += 1
    return failed


def throughput(url: str, token: str, burst: int, clients: int) -> float:
    """`clients` processes (not threads: one interpreter could not drive the server hard enough)."""
    per = burst // clients
    with ProcessPoolExecutor(clients) as pool:
        pool.submit(int).result()  # the workers are up before the clock starts
        start = time.perf_counter()
        failed = sum(
            pool.map(
                _submit_many, [url] * clients, [token] * clients, [f"tp{k}" for k in range(clients)], [per] * clients
            )
        )
        elapsed = time.perf_counter() - start
    if failed:
        raise RuntimeError(f"{failed} submits failed")
    return per * clients / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--burst", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=4, help="client processes for the burst")
    ap.add_argument("--db", default=None, help="postgresql://... (default: SQLite in the temp dir)")
    ap.add_argument("--single-user", action="store_true", help="no sandbox: what isolation costs")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gpupool-bench-"))
    proc, url, token = _start(root, args.db, args.single_user)
    try:
        with Client(url, token) as c:
            c.create_department(DepartmentCreate(name="bench-dept", deserved_gpus=8))
            c.create_project(ProjectCreate(name="bench", department="bench-dept", deserved_gpus=8))
            lat = latency(c, args.count)
            print(f"latency: p50 {_pct(lat, 0.5):.1f} ms, p99 {_pct(lat, 0.99):.1f} ms", flush=True)
        rate = throughput(url, token, args.burst, args.clients)
        print(f"throughput: {rate:.0f} submits/s", flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        for rec in (root / "data" / "run").glob("*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                os.killpg(int(json.loads(rec.read_text())["pid"]), signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)
    result = {
        "benchmark": "submit_latency",
        "store": "postgresql" if args.db else "sqlite",
        "sandboxed": not args.single_user and os.geteuid() == 0,
        "count": args.count,
        "p50_ms": round(_pct(lat, 0.5), 1),
        "p99_ms": round(_pct(lat, 0.99), 1),
        "max_ms": round(max(lat), 1),
        "burst": args.burst,
        "clients": args.clients,
        "submits_per_s": round(rate, 1),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
