"""Submit to pod bound and to Running on a real Kubernetes API server (etcd + kube-apiserver + kwok).

Builds (or reuses) the binaries with scripts/build-k8s, starts the control plane on 127.0.0.1, registers
`--nodes` kwok nodes with 8 GPUs each, and starts `gpupool server --backend kubernetes` on it. Then:

* latency: `--count` sequential submits of a 1-GPU workload; the times from the submit call returning to its pod
  appearing bound (gpupool creates pods with spec.nodeName set) and to the pod reported Running, both seen
  through a watch on the API server;
* burst: `--burst` submits of 1-GPU workloads that run 2 s each, from 4 client processes; the binding rate is
  pods bound per second from the first submit to the last pod bound.

The last line is JSON with bound_p50_ms, bound_p99_ms, running_p50_ms, running_p99_ms and binds_per_s.

    python benchmarks/kube_bind.py
    python benchmarks/kube_bind.py --nodes 10 --count 20 --burst 100
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
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.conftest import Server
from tests.kubernetes.cluster import Cluster, binaries

from gpupool.models.schemas import ProjectCreate, WorkloadCreate


class PodClock:
    """When each workload's pod was first seen (bound) and first seen Running, from a watch."""

    def __init__(self, cluster: Cluster) -> None:
        import kubernetes

        k8s: Any = kubernetes
        client, watch = k8s.client, k8s.watch
        self.bound: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self._core = client.CoreV1Api(cluster.api())
        self._watch = watch.Watch()
        self._gone = client.ApiException
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        """List once, then watch from the list's version, resuming where each watch ended; list again only when
        the API server says that version is gone (410), as gpupool's own watch does."""
        selector = "gpupool.io/managed=true"
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
        name = (pod.metadata.labels or {}).get("gpupool.io/workload")
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--burst", type=int, default=1000)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    root = Path(tempfile.mkdtemp(prefix="gpupool-kbench-"))
    cluster = Cluster(root, binaries()).start()
    server: Server | None = None
    try:
        cluster.add_gpu_nodes(args.nodes, prefix="bench")
        (root / "srv").mkdir()
        server = Server(root / "srv", None, "fake:1xH100-80GB", ("--backend", "kubernetes", "--kubeconfig",
                        str(cluster.kubeconfig))).start()  # fmt: skip
        c = server.client()
        deadline = time.monotonic() + 120
        while sum(1 for n in c.nodes() if n.schedulable) < args.nodes and time.monotonic() < deadline:
            time.sleep(0.5)
        c.create_project(ProjectCreate(name="bench", deserved_gpus=8 * args.nodes, pool="h100"))
        clock = PodClock(cluster)
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
        clients = 4
        per = args.burst // clients
        with ProcessPoolExecutor(clients) as pool:
            pool.submit(int).result()
            start = time.time()
            list(pool.map(_burst, [server.url] * clients, [server.admin_token] * clients,
                          [f"b{k}" for k in range(clients)], [per] * clients))  # fmt: skip
        names = [f"b{k}-{i}" for k in range(clients) for i in range(per)]
        deadline = time.monotonic() + 600
        while not all(n in clock.bound for n in names) and time.monotonic() < deadline:
            time.sleep(0.1)
        last = max(clock.bound[n] for n in names if n in clock.bound)
        rate = sum(1 for n in names if n in clock.bound) / (last - start)
        print(f"burst: {rate:.0f} pods bound per second", flush=True)
    finally:
        if server is not None:
            server.kill()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({
        "benchmark": "kube_bind", "nodes": args.nodes, "gpus": 8 * args.nodes, "count": args.count,
        "bound_p50_ms": round(_pct(bound, 0.5), 1), "bound_p99_ms": round(_pct(bound, 0.99), 1),
        "running_p50_ms": round(_pct(running, 0.5), 1), "running_p99_ms": round(_pct(running, 0.99), 1),
        "burst": per * clients, "binds_per_s": round(rate, 1),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }))  # fmt: skip


if __name__ == "__main__":
    main()
