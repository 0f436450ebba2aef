"""The live control plane at scale: a real Controller and the real API over a store of `--running` running and
`--pending` pending workloads on `--nodes` nodes of 8 simulated GPUs.

The store is built directly (bulk inserts: departments and projects, running workloads with their allocations,
pending workloads, a submit event each), on SQLite in a temp dir, on `--db URL`, or with `--db postgresql` on a
throwaway PostgreSQL server (Debian's packages, as the tests start one). The controller drives a backend that
runs nothing (only the GPUs are simulated): a launch is alive at once, a stop ends it, and the benchmark ends a
few running workloads between cycles, so each steady cycle reconciles, binds, persists and launches a little.

It measures, in order:

* the first cycle (it writes every pending workload's reason) and `--cycles` steady cycles, each with the
  control plane's steps (reconcile ... commit_events) and the core's (open ... explain);
* with the scheduler loop running: `--requests` cancels (of pending work) and describes, and list pages of
  100 (all workloads, one project's, one state's; each walked page after page), through the real app in
  process (httpx's ASGI transport), p50 and p99;
* threads and RSS.

Progress goes to stdout; the last line is one JSON object with the figures.

    python benchmarks/control_scale.py                                  # 1,000 running, 100,000 pending
    python benchmarks/control_scale.py --running 200 --pending 5000 --nodes 25
    python benchmarks/control_scale.py --db postgresql
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import insert, select

from gpupool.api.app import create_app
from gpupool.backends.base import AppEndpoint, Capabilities, LaunchSpec, Observed, Sample
from gpupool.control.controller import Controller
from gpupool.core import Device, Node
from gpupool.lifecycle.phases import AllocPhase, Phase
from gpupool.server import build
from gpupool.settings import Settings
from gpupool.store.tables import AllocationRow, EventRow, QueueRow, UserRow, WorkloadRow

GPUS_PER_NODE = 8
GPU_MEMORY_MIB = 80 * 1024
POOL = "default"
PROJECTS = 10
CONTROL_STEPS = ("reconcile", "policies", "telemetry", "snapshot", "schedule", "persist", "commit", "act", "estimates")
CORE_STEPS = ("open", "stale_gangs", "allocate", "reclaim", "preempt", "consolidate", "explain")


class NullBackend:
    """Runs nothing: a launch is alive until stopped or ended by the benchmark. Only the GPUs are simulated."""

    def __init__(self, nodes: int) -> None:
        devices = tuple(Device(i, "H100", GPU_MEMORY_MIB) for i in range(GPUS_PER_NODE))
        self.nodes = [Node(f"node-{i:03d}", POOL, 128_000, 1024 * 1024, devices) for i in range(nodes)]
        self.members: dict[str, Observed] = {}
        self.lock = threading.Lock()
        self.launches = 0

    def inventory(self) -> list[Node]:
        return list(self.nodes)

    def capabilities(self) -> Capabilities:
        return Capabilities("bench", extra={"gpus": "simulated"})

    def launch(self, spec: LaunchSpec) -> None:
        with self.lock:
            if spec.alloc_id not in self.members:
                self.members[spec.alloc_id] = Observed(spec.alloc_id, alive=True)
                self.launches += 1

    def stop(self, alloc_id: str, force: bool) -> None:
        with self.lock:
            if alloc_id in self.members:
                self.members[alloc_id] = Observed(alloc_id, alive=False, exit_code=143)

    def observe(self) -> dict[str, Observed] | None:
        with self.lock:
            return dict(self.members)

    def forget(self, alloc_id: str) -> None:
        with self.lock:
            self.members.pop(alloc_id, None)

    def read_log(self, workload_id: int, rank: int, offset: int, limit: int) -> bytes:
        return b""

    def healthy(self, alloc_id: str, port: int | None) -> bool:
        return True

    def app_endpoint(self, alloc_id: str, port: int | None) -> AppEndpoint | None:
        return None

    def sample(self) -> Sample:
        return Sample({}, (), True)

    def end(self, count: int, rng: random.Random) -> int:
        """Ends `count` running members (exit 0), as finished work would."""
        with self.lock:
            alive = [a for a, o in self.members.items() if o.alive]
            for alloc_id in rng.sample(alive, min(count, len(alive))):
                self.members[alloc_id] = Observed(alloc_id, alive=False, exit_code=0)
            return min(count, len(alive))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))] if ordered else 0.0


def _ms(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(1000 * _pct(values, 0.5), 1), "p99_ms": round(1000 * _pct(values, 0.99), 1)}


def _rss_mib() -> dict[str, float]:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {k: round(int(fields[k].split()[0]) / 1024, 1) for k in ("VmRSS", "VmHWM")}


def populate(ctx: Any, running: int, pending: int, seed: int) -> list[str]:
    """Bulk rows: PROJECTS projects under one department; `running` 1-GPU workloads, each on its own device;
    `pending` workloads of 1 to 8 GPUs. Returns the running allocations' ids."""
    rng = random.Random(seed)
    now = time.time()
    with ctx.sessions() as s:
        owner = s.scalar(select(UserRow.id).order_by(UserRow.id))
        dept = s.scalar(insert(QueueRow).returning(QueueRow.id), [
            {"name": "bench", "kind": "department", "policy": {}, "created_at": now}
        ])  # fmt: skip
        s.execute(insert(QueueRow), [
            {"name": f"p{i}", "kind": "project", "parent_id": dept, "policy": {}, "created_at": now}
            for i in range(PROJECTS)
        ])  # fmt: skip
        projects = list(s.scalars(select(QueueRow.id).where(QueueRow.kind == "project").order_by(QueueRow.id)))
        common = {
            "owner_id": owner, "type": "training", "priority_class": "training", "priority": 50,
            "preemptible": True, "min_runtime_s": 0.0, "gpu_milli": 0, "gpu_memory_mib": 0, "cpu_milli": 1000,
            "memory_mib": 4096, "workers": 1, "pools": [], "command": ["true"], "env": {}, "grace_s": 30.0,
            "reason_args": {}, "nominated": [], "hold": False, "attempt": 0,
        }  # fmt: skip
        rows: list[dict[str, Any]] = []
        for i in range(running):
            rows.append(common | {
                "name": f"run-{i}", "project_id": projects[i % PROJECTS], "gpus": 1, "state": Phase.RUNNING.value,
                "reason_event": "running", "created_at": now - 3600, "queued_at": now - 3600,
                "started_at": now - 1800,
            })  # fmt: skip
        sizes = [1] * 7 + [2, 4, 8]
        for i in range(pending):
            rows.append(common | {
                "name": f"pend-{i}", "project_id": projects[i % PROJECTS], "gpus": rng.choice(sizes),
                "state": Phase.PENDING.value, "reason_event": "queued", "reason_code": "waiting",
                "created_at": now - 600 + i * 1e-3, "queued_at": now - 600 + i * 1e-3,
            })  # fmt: skip
        chunk = 20_000
        for at in range(0, len(rows), chunk):
            s.execute(insert(WorkloadRow), rows[at : at + chunk])
        ids = list(s.scalars(select(WorkloadRow.id).where(WorkloadRow.state == "running").order_by(WorkloadRow.id)))
        allocs = [_allocation(n, wid, now) for n, wid in enumerate(ids)]
        s.execute(insert(AllocationRow), allocs)
        every = list(s.scalars(select(WorkloadRow.id).order_by(WorkloadRow.id)))
        events = [
            {"workload_id": wid, "at": now - 600, "state": "pending", "code": "submitted", "args": {"by": "bench"}}
            for wid in every
        ]
        for at in range(0, len(events), chunk):
            s.execute(insert(EventRow), events[at : at + chunk])
        s.commit()
    return [a["id"] for a in allocs]


def _allocation(n: int, wid: int, now: float) -> dict[str, Any]:
    """The n-th running workload's one member, on device n % 8 of node n // 8."""
    return {
        "id": f"{wid}-0-0", "workload_id": wid, "attempt": 0, "member": 0, "node": f"node-{n // GPUS_PER_NODE:03d}",
        "devices": [{"index": n % GPUS_PER_NODE, "milli": 1000, "memory_mib": GPU_MEMORY_MIB}],
        "state": AllocPhase.READY.value, "enforced": False, "created_at": now - 1800,
    }  # fmt: skip


class GcTime:
    """Time spent in the cyclic garbage collector, by generation (gc.callbacks)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0
        gc.callbacks.append(self._note)

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._started

    def take(self) -> list[float]:
        out, self.seconds = self.seconds, [0.0, 0.0, 0.0]
        return out


class Steps:
    """Per-cycle durations of each step, read off the controller's step histogram."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.last = self._sums()

    def _sums(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for metric in self.controller.step_seconds.collect():
            for sample in metric.samples:
                if sample.name.endswith("_sum"):
                    out[sample.labels["step"]] = sample.value
        return out

    def delta(self) -> dict[str, float]:
        now = self._sums()
        out = {k: v - self.last.get(k, 0.0) for k, v in now.items()}
        self.last = now
        return out


def _steps_ms(deltas: list[dict[str, float]], names: tuple[str, ...]) -> dict[str, float]:
    return {n: round(1000 * statistics.median(d.get(n, 0.0) for d in deltas), 1) for n in names}


async def requests(app: Any, token: str, controller: Controller, args: argparse.Namespace) -> dict[str, Any]:
    """Cancels, describes and list pages while the scheduler loop runs; their latencies."""
    rng = random.Random(args.seed + 1)
    headers = {"Authorization": f"Bearer {token}"}
    transport = httpx.ASGITransport(app=app)
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(transport=transport, base_url="http://bench", headers=headers) as c:

        async def timed(method: str, url: str, **kw: Any) -> float:
            # Spread over several cycles: a request lands at a random moment of one.
            await asyncio.sleep(rng.uniform(0, args.spacing_s))
            started = time.perf_counter()
            r = await c.request(method, url, **kw)
            took = time.perf_counter() - started
            if r.status_code >= 400:
                raise RuntimeError(f"{method} {url}: {r.status_code} {r.text[:200]}")
            return took

        names = [f"pend-{i}" for i in rng.sample(range(args.pending), min(args.requests, args.pending))]
        cycles_before = controller.cycles
        cancels = [await timed("POST", f"/api/v1/workloads/{n}/cancel", params={"project": _project(n)}) for n in names]
        describes = []
        for _ in range(args.requests):
            n = f"pend-{rng.randrange(args.pending)}"
            describes.append(await timed("GET", f"/api/v1/workloads/{n}", params={"project": _project(n)}))
        out["cancel"] = _ms(cancels)
        out["describe"] = _ms(describes)
        lists: tuple[tuple[str, dict[str, str]], ...] = (
            ("list_all", {}),
            ("list_project", {"project": "p3"}),
            ("list_state", {"state": "running"}),
        )
        for label, params in lists:
            pages: list[float] = []
            after: str | None = "0" if args.page_param == "after" else None  # oldest first from the start
            while len(pages) < args.pages:
                query = {**params, "limit": 100} | ({args.page_param: after} if after else {})
                await asyncio.sleep(rng.uniform(0, args.spacing_s))
                started = time.perf_counter()
                r = await c.get("/api/v1/workloads", params=query)
                pages.append(time.perf_counter() - started)
                r.raise_for_status()
                after = r.json()["next_cursor"]
                if after is None:
                    break
            out[label] = _ms(pages) | {"pages": len(pages)}
        out["cycles_meanwhile"] = controller.cycles - cycles_before
    return out


def _project(name: str) -> str:
    return f"p{int(name.split('-')[1]) % PROJECTS}"


@contextmanager
def store(db: str | None, root: Path) -> Iterator[str | None]:
    if db != "postgresql":
        yield db
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.e2e.postgres import Postgres

    pg = Postgres(Path(tempfile.mkdtemp(prefix="gpupool-pg-")))
    pg.start()
    try:
        yield pg.new_database()
    finally:
        pg.stop()
        shutil.rmtree(pg.root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--running", type=int, default=1000)
    ap.add_argument("--pending", type=int, default=100_000)
    ap.add_argument("--nodes", type=int, default=125)
    ap.add_argument("--cycles", type=int, default=10, help="steady cycles timed one by one")
    ap.add_argument("--end-per-cycle", type=int, default=5, help="running workloads that end before each cycle")
    ap.add_argument("--requests", type=int, default=200, help="cancels, and describes, while the loop runs")
    ap.add_argument("--pages", type=int, default=50, help="list pages walked per kind of list")
    ap.add_argument("--spacing-s", type=float, default=0.05, help="a random pause of up to this before each request")
    ap.add_argument("--page-param", default="after", choices=("after", "cursor"))
    ap.add_argument("--db", default=None, help="postgresql (a throwaway server) or a URL; default SQLite")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-estimates", action="store_true", help="switch start-time estimates off (on by default)")
    ap.add_argument("--profile", default=None, help="write a cProfile file of the last steady cycle here")
    args = ap.parse_args()
    if args.running > args.nodes * GPUS_PER_NODE:
        ap.error("--running is at most --nodes × 8 (one GPU each)")
    root = Path(tempfile.mkdtemp(prefix="gpupool-scale-"))
    try:
        with store(args.db, root) as url:
            result = run(args, root, url)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result))


def run(args: argparse.Namespace, root: Path, url: str | None) -> dict[str, Any]:
    settings = Settings(data_dir=root / "data", gpus="fake:8xH100-80GB", db_url=url, single_user=True)
    ctx, _ = build(settings)
    token = (root / "data" / "admin-token").read_text().strip()
    backend = NullBackend(args.nodes)
    started = time.perf_counter()
    for alloc_id in populate(ctx, args.running, args.pending, args.seed):
        backend.members[alloc_id] = Observed(alloc_id, alive=True)
    print(f"store: {args.running} running, {args.pending} pending in {time.perf_counter() - started:.1f} s", flush=True)
    controller = Controller(ctx.sessions, backend, interval_s=0.2, telemetry_interval_s=5.0)
    if args.no_estimates:
        controller.estimates.budget_s = 0.0  # switched off
    ctx.backend, ctx.controller = backend, controller
    controller.register_nodes()
    steps = Steps(controller)
    rng = random.Random(args.seed)

    t = time.perf_counter()
    controller.cycle()
    first = time.perf_counter() - t
    steps.delta()
    print(f"first cycle: {first:.2f} s", flush=True)
    totals: list[float] = []
    cpu: list[float] = []
    deltas: list[dict[str, float]] = []
    gc_time = GcTime()
    gc_s: list[float] = []
    binds = 0
    for i in range(args.cycles):
        backend.end(args.end_per_cycle, rng)
        profile = cProfile.Profile() if args.profile and i == args.cycles - 1 else None
        t, c = time.perf_counter(), time.thread_time()
        if profile is not None:
            profile.runcall(controller.cycle)
            profile.dump_stats(args.profile)
        else:
            controller.cycle()
        totals.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)
        deltas.append(steps.delta())
        gc_s.append(sum(gc_time.take()))
        decision = controller.last_decision
        binds += len(decision.binds) if decision is not None else 0
        print(f"steady cycle {i}: {totals[-1]:.3f} s", flush=True)

    # A server that starts (or a standby that takes over) reads every row once; the reasons are written already.
    fresh = Controller(ctx.sessions, backend, interval_s=0.2, telemetry_interval_s=5.0)
    t = time.perf_counter()
    fresh.cycle()
    restart = time.perf_counter() - t
    fresh.stop()
    print(f"first cycle of a restarted controller: {restart:.2f} s", flush=True)

    stop = threading.Event()

    def churn() -> None:
        while not stop.wait(1.0):
            backend.end(args.end_per_cycle, rng)
            controller.wake()

    ender = threading.Thread(target=churn, daemon=True)
    controller.start()
    ender.start()
    try:
        latencies = asyncio.run(requests(create_app(ctx), token, controller, args))
    finally:
        stop.set()
        ender.join()
        controller.stop()
    threads = threading.active_count()
    est = controller.estimates
    forecast = est.forecast
    return {
        "benchmark": "control_scale",
        "store": "sqlite" if url is None else url.split(":", 1)[0],
        "running": args.running,
        "pending": args.pending,
        "nodes": args.nodes,
        "gpus": args.nodes * GPUS_PER_NODE,
        "first_cycle_s": round(first, 3),
        "restart_cycle_s": round(restart, 3),
        "steady_cycle_p50_s": round(statistics.median(totals), 3),
        "steady_cycle_max_s": round(max(totals), 3),
        "steady_cycle_cpu_p50_s": round(statistics.median(cpu), 3),
        "steady_binds": binds,
        "steady_gc_ms": round(1000 * statistics.median(gc_s), 1),
        "steps_ms": _steps_ms(deltas, CONTROL_STEPS),
        "core_ms": _steps_ms(deltas, CORE_STEPS),
        **latencies,
        "estimates": {
            "on": not args.no_estimates,
            "forecasts": est.forecasts,
            "failures": est.failures,
            "last_wall_s": round(getattr(forecast, "wall_s", 0.0), 1),
        },
        "threads": threads,
        "rss_mib": _rss_mib(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }


if __name__ == "__main__":
    main()
