"""Submit to pod bound and to Running on a real Kubernetes API server (etcd + kube-apiserver + kwok).

Builds (or reuses) the binaries with scripts/build-k8s, starts the control plane on 127.0.0.1, registers
`--nodes` kwok nodes with 8 GPUs each, and starts `gpupool server --backend kubernetes` on it. Then:

* latency: `--count` sequential submits of a 1-GPU workload; the times from the submit call returning to its pod
  appearing bound (gpupool creates pods with spec.nodeName set) and to the pod reported Running, both seen
  through a watch on the API server;
* burst: `--burst` submits of 1-GPU workloads that run 2 s each, from 4 client processes; the binding rate is
  pods bound per second from the first submit to the last pod bound;
* foreign (benchmarks/kube_foreign.py): `--burst` plain pods that name gpupool as their scheduler, created by 4
  client processes, which gpupool adopts and binds, against the API server's ceiling measured first in the same
  run (the same processes create `--burst` pods naming a scheduler nobody serves and bind each one themselves);
  then where the time goes: each process's CPU, gpupool's cycle steps and (`--py-spy HZ`) a profile of the server.
  The ceiling's pods wait for no room, so before this burst nodes are added until every pod fits at once
  (`--foreign-nodes` sets how many there are instead: `--foreign-nodes 50` makes pods wait for earlier ones).

`--mode submit` runs latency and burst, `--mode foreign` the foreign burst, `--mode all` (the default) both. The
last line is JSON with bound_p50_ms, bound_p99_ms, running_p50_ms, running_p99_ms and binds_per_s (null where
not run), and ceiling_binds_per_s, foreign_binds_per_s and foreign_ratio (foreign / ceiling).

    python benchmarks/kube_bind.py
    python benchmarks/kube_bind.py --nodes 10 --count 20 --burst 100
    python benchmarks/kube_bind.py --mode foreign --burst 1000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.conftest import Server
from tests.kubernetes.cluster import Cluster, binaries

import kube_foreign as foreign
from gpupool.models.schemas import ProjectCreate, QuotaUpdate, WorkloadCreate

CLIENTS = 4
"""Client processes of a burst (submits, or pod creates)."""
MANAGED = "gpupool.io/managed=true"
ENDED = {"succeeded", "failed", "cancelled"}


def _workload(pod: Any) -> str | None:
    """A gpupool pod's workload (gpupool creates its pods bound)."""
    return str((pod.metadata.labels or {}).get("gpupool.io/workload") or "") or None


def _bound(pod: Any) -> str | None:
    """A foreign pod's name, once it is bound."""
    return str(pod.metadata.name) if pod.spec.node_name else None


class PodClock:
    """When each pod `key` names (its workload's name; None: not yet) was first seen so and first seen Running, from
    a watch of the pods `selector` selects."""

    def __init__(self, cluster: Cluster, selector: str = MANAGED, key: Callable[[Any], str | None] = _workload) -> None:
        import kubernetes

        k8s: Any = kubernetes
        client, watch = k8s.client, k8s.watch
        self.bound: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self._selector, self._key = selector, key
        self._core = client.CoreV1Api(cluster.api())
        self._watch = watch.Watch()
        self._gone = client.ApiException
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        """List once, then watch from the list's version, resuming where each watch ended; list again only when
        the API server says that version is gone (410), as gpupool's own watch does."""
        selector = self._selector
        version: str | None = None
        while True:
            try:
                if version is None:
                    listing = self._core.list_pod_for_all_namespaces(label_selector=selector)
                    for pod in listing.items:
                        self._see(pod)
                    version = listing.metadata.resource_version
                for event in self._watch.stream(
                    self._core.list_pod_for_all_namespaces, label_selector=selector, resource_version=version,
                    allow_watch_bookmarks=True, timeout_seconds=60,
                ):  # fmt: skip
                    if event["type"] != "BOOKMARK":
                        self._see(event["object"])
                    version = self._watch.resource_version or version
            except self._gone as e:
                if e.status == 410:
                    version = None
                else:
                    time.sleep(0.2)
            except Exception:  # the cluster is going away at the end of the run, or a watch broke
                time.sleep(0.2)

    def _see(self, pod: Any) -> None:
        name = self._key(pod)
        if not name:
            return
        now = time.time()
        self.bound.setdefault(name, now)
        if pod.status.phase == "Running":
            self.running.setdefault(name, now)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _burst(url: str, token: str, prefix: str, count: int) -> None:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        for i in range(count):
            body = WorkloadCreate(project="bench", name=f"{prefix}-{i}", type="batch", gpus=1, command=["run"],
                                  env={"RUN_FOR": "2s"})  # fmt: skip
            r = http.post("/api/v1/workloads", content=body.model_dump_json(exclude_none=True))
            r.raise_for_status()


def _submit_modes(args: argparse.Namespace, server: Server, clock: PodClock) -> dict[str, Any]:
    """Latency (sequential submits) and the submit burst; their JSON keys."""
    c = server.client()
    bound: list[float] = []
    running: list[float] = []
    for i in range(args.count):
        body = WorkloadCreate(project="bench", name=f"lat-{i}", gpus=1, command=["run"], env={"RUN_FOR": "1s"})
        c.submit(body)
        t0 = time.time()
        while f"lat-{i}" not in clock.running:
            time.sleep(0.002)
        bound.append((clock.bound[f"lat-{i}"] - t0) * 1000)
        running.append((clock.running[f"lat-{i}"] - t0) * 1000)
    print(f"latency: bound p50 {_pct(bound, 0.5):.0f} ms, running p50 {_pct(running, 0.5):.0f} ms", flush=True)
    per = args.burst // CLIENTS
    with ProcessPoolExecutor(CLIENTS) as pool:
        pool.submit(int).result()
        start = time.time()
        list(pool.map(_burst, [server.url] * CLIENTS, [server.admin_token] * CLIENTS,
                      [f"b{k}" for k in range(CLIENTS)], [per] * CLIENTS))  # fmt: skip
    names = [f"b{k}-{i}" for k in range(CLIENTS) for i in range(per)]
    deadline = time.monotonic() + 600
    while not all(n in clock.bound for n in names) and time.monotonic() < deadline:
        time.sleep(0.1)
    last = max(clock.bound[n] for n in names if n in clock.bound)
    rate = sum(1 for n in names if n in clock.bound) / (last - start)
    print(f"burst: {rate:.0f} pods bound per second", flush=True)
    return {
        "bound_p50_ms": round(_pct(bound, 0.5), 1), "bound_p99_ms": round(_pct(bound, 0.99), 1),
        "running_p50_ms": round(_pct(running, 0.5), 1), "running_p99_ms": round(_pct(running, 0.99), 1),
        "burst": per * CLIENTS, "binds_per_s": round(rate, 1),
    }  # fmt: skip


def _foreign_mode(cluster: Cluster, server: Server, pids: dict[str, int], ceiling: foreign.Phase, count: int,
                  py_spy: int) -> dict[str, Any]:  # fmt: skip
    """The foreign burst against the ceiling measured before gpupool started, and where its time went."""
    assert server.proc is not None
    c = server.client()
    clock = PodClock(cluster, f"{foreign.PROJECT}=bench", _bound)
    pids = pids | {"gpupool": server.proc.pid, "benchmark (watch)": os.getpid()}
    profile = Path(tempfile.gettempdir()) / f"kube_bind-py-spy-{os.getpid()}.txt"
    before = c.metrics()
    with foreign.profiled(server.proc.pid, profile, py_spy) as spy:
        pids |= {"py-spy": spy} if spy is not None else {}
        burst = foreign.foreign_burst(str(cluster.kubeconfig), pids, count, CLIENTS, "bench", clock.bound)
    after = c.metrics()
    ratio = burst.rate / ceiling.rate
    target = min(0.6 * ceiling.rate, 200.0)
    print(
        f"foreign: {burst.pods} pods bound in {burst.seconds:.1f} s: {burst.rate:.0f} pods/s, "
        f"{ratio:.0%} of the ceiling's {ceiling.rate:.0f} (target {target:.0f}: "
        f"{'met' if burst.rate >= target else 'missed'}); creates took {burst.creates_s:.1f} s",
        flush=True,
    )
    print(f"foreign {burst.cpu_line()}", flush=True)
    print("gpupool's cycle steps during the foreign burst:", flush=True)
    print("\n".join(foreign.step_lines(before, after, burst.seconds)), flush=True)
    if spy is not None:
        print("gpupool server profile during the foreign burst:", flush=True)
        print("\n".join(foreign.profile_lines(profile, py_spy)), flush=True)
    return {
        "foreign": burst.pods, "ceiling_binds_per_s": round(ceiling.rate, 1),
        "foreign_binds_per_s": round(burst.rate, 1), "foreign_ratio": round(ratio, 3),
    }  # fmt: skip


def _all_ended(server: Server) -> bool:
    return all(w.state in ENDED for w in server.client().list_workloads(project="bench"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--burst", type=int, default=1000)
    ap.add_argument("--mode", choices=("all", "submit", "foreign"), default="all")
    ap.add_argument(
        "--foreign-nodes",
        type=int,
        default=0,
        help="nodes for the foreign burst (default: room for all its pods at once, at least --nodes)",
    )
    ap.add_argument("--py-spy", type=int, default=0, metavar="HZ",
                    help="profile the server with py-spy (from the virtualenv) during the foreign burst")  # fmt: skip
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    root = Path(tempfile.mkdtemp(prefix="gpupool-kbench-"))
    cluster = Cluster(root, binaries()).start()
    server: Server | None = None
    out: dict[str, Any] = dict.fromkeys(("bound_p50_ms", "bound_p99_ms", "running_p50_ms", "running_p99_ms",
                                         "burst", "binds_per_s"))  # fmt: skip
    try:
        nodes = cluster.add_gpu_nodes(args.nodes, prefix="bench")
        pids = {Path(f"/proc/{p.pid}/comm").read_text().strip(): p.pid for p in cluster.procs}
        if args.mode != "submit":  # the ceiling first, with nothing of gpupool's running
            ceiling = foreign.ceiling(str(cluster.kubeconfig), pids, args.burst, CLIENTS, nodes)
            print(f"ceiling: {ceiling.pods} pods created and bound by {CLIENTS} plain clients in "
                  f"{ceiling.seconds:.1f} s: {ceiling.rate:.0f} pods/s", flush=True)  # fmt: skip
            print(f"ceiling {ceiling.cpu_line()}", flush=True)
            foreign.clear_ceiling(str(cluster.kubeconfig))
        (root / "srv").mkdir()
        server = Server(root / "srv", None, "fake:1xH100-80GB", ("--backend", "kubernetes", "--kubeconfig",
                        str(cluster.kubeconfig)))  # fmt: skip
        server.args += ("--public-url", server.url)  # where pods fetch their code: the port is only known now
        server.start()
        c = server.client()
        deadline = time.monotonic() + 120
        while sum(1 for n in c.nodes() if n.schedulable) < args.nodes and time.monotonic() < deadline:
            time.sleep(0.5)
        c.create_project(ProjectCreate(name="bench", deserved_gpus=8 * args.nodes, pool="h100"))
        if args.mode != "foreign":
            out |= _submit_modes(args, server, PodClock(cluster))
            deadline = time.monotonic() + 120  # the burst's last workloads end before the foreign burst
            while args.mode == "all" and not _all_ended(server) and time.monotonic() < deadline:
                time.sleep(1)
        if args.mode != "submit":
            room = max(args.nodes, args.foreign_nodes or -(-args.burst // 8))
            if room > args.nodes:  # the ceiling's pods wait for no room: neither do these, unless asked
                cluster.add_gpu_nodes(room - args.nodes, prefix="room")
                c.update_quota("bench", QuotaUpdate(pool="h100", deserved_gpus=8 * room))
                deadline = time.monotonic() + 120
                while sum(1 for n in c.nodes() if n.schedulable) < room and time.monotonic() < deadline:
                    time.sleep(0.5)
            out |= {"foreign_nodes": room} | _foreign_mode(cluster, server, pids, ceiling, args.burst, args.py_spy)
    finally:
        if server is not None:
            server.kill()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({
        "benchmark": "kube_bind", "mode": args.mode, "nodes": args.nodes, "gpus": 8 * args.nodes,
        "count": args.count, **out,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }))  # fmt: skip


if __name__ == "__main__":
    main()
