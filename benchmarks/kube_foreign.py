"""The foreign-pod mode of benchmarks/kube_bind.py: pods gpupool did not create, against the API server's ceiling.

* ceiling: before gpupool starts, `clients` processes create pods that name a scheduler nobody serves and bind
  each one themselves with a Binding (create, then bind, one pod at a time each); pods per second from the first
  create to the last bind answered. The pods are deleted before gpupool starts.
* foreign: the same processes create plain pods with `spec.schedulerName: gpupool` and the project label; gpupool
  adopts each one as a workload and binds it through the Binding subresource. Pods per second from the first
  create to the last pod seen bound (`spec.nodeName` set) through a watch.

Where the time goes: each process's CPU seconds during each phase (/proc), gpupool's per-step cycle timings
(`gpupool_scheduler_step_seconds` on /metrics, before and after) and, asked (`--py-spy HZ`, py-spy in the
virtualenv), a profile of what the gpupool server did during the foreign burst while it held the interpreter
(py-spy --gil: its CPU outside the interpreter, OpenSSL's and SQLite's, is the rest of its CPU seconds).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEDULER = "gpupool"
"""The server's scheduler_name (its default)."""
NOBODY = "nobody"
"""The scheduler the ceiling's pods name: nobody serves it, so only the client binds them."""
BENCH = "gpupool-bench"
PROJECT = "gpupool.io/project"
TICK = os.sysconf("SC_CLK_TCK")

# What a sample of the server's threads was doing: the first of these, in this order, that a frame of its stack
# matches (label, the frame's function, a fragment of its file's path). The watch's come last: the cycle's own
# reads deserialise too.
CATEGORIES = (
    ("bind: annotation patch", "patch_namespaced_pod", "core_v1_api.py"),
    ("bind: Binding", "create_namespaced_pod_binding", "core_v1_api.py"),
    ("bind: other", "launch", "kubernetes/backend.py"),
    ("adoption (admit)", "admit", "control/foreign.py"),
    ("reconcile: observe", "observe", "kubernetes/backend.py"),
    ("reconcile: view refresh", "refresh", "control/view.py"),
    ("reconcile: other", "reconcile", "control/reconcile.py"),
    ("snapshot", "build_snapshot", "store/snapshot.py"),
    ("schedule", "schedule", "core/cycle.py"),
    ("persist", "persist", "control/apply.py"),
    ("commit", "_commit_checked", "control/controller.py"),
    ("act (launch pool)", "_launch_all", "control/controller.py"),
    ("act: other", "act", "control/apply.py"),
    ("explain (waiting pods)", "explain", "control/foreign.py"),
    ("estimates", "after_cycle", "control/estimates.py"),
    ("inventory", "register_nodes", "control/controller.py"),
    ("cycle: other", "_pass", "control/controller.py"),
    ("HTTP API", "", "starlette/"),
    ("HTTP API", "", "uvicorn/"),
    ("pod watch: deserialise", "deserialize", "api_client.py"),
    ("pod watch: to dict", "sanitize_for_serialization", "api_client.py"),
    ("pod watch: apply", "_apply", "podwatch.py"),
    ("pod watch: other", "_run", "podwatch.py"),
)


def manifest(name: str, scheduler: str, labels: dict[str, str]) -> dict[str, Any]:
    """A 1-GPU pod that runs 2 s once bound (kwok's stage reads RUN_FOR), as the submit burst's workloads."""
    container = {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}},
                 "env": [{"name": "RUN_FOR", "value": "2s"}]}  # fmt: skip
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
        "spec": {"schedulerName": scheduler, "restartPolicy": "Never", "containers": [container]},
    }  # fmt: skip


def _core(kubeconfig: str) -> Any:
    import kubernetes

    k8s: Any = kubernetes
    return k8s.client.CoreV1Api(k8s.config.new_client_from_config(config_file=kubeconfig))


def _ceiling_client(kubeconfig: str, prefix: str, count: int, nodes: list[str]) -> tuple[float, float, float]:
    """One creator of the ceiling: create each pod, then bind it. (first create, last bind answered, CPU s)."""
    core = _core(kubeconfig)
    cpu = time.process_time()
    first = time.time()
    for i in range(count):
        name = f"{prefix}-{i}"
        core.create_namespaced_pod("default", manifest(name, NOBODY, {BENCH: "ceiling"}))
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                "target": {"kind": "Node", "name": nodes[i % len(nodes)]}}  # fmt: skip
        # The generated client cannot read the Status this answers with: the response is not deserialised, but
        # read, which hands its connection back to the pool (an unread one is never reused: a new TLS connection
        # for each request after it).
        core.create_namespaced_pod_binding(name, "default", body, _preload_content=False).read()
    return first, time.time(), time.process_time() - cpu


def _foreign_client(kubeconfig: str, prefix: str, count: int, project: str) -> tuple[float, float, float]:
    """One creator of the foreign burst: plain pods naming gpupool. (first create, last create answered, CPU s)."""
    core = _core(kubeconfig)
    cpu = time.process_time()
    first = time.time()
    for i in range(count):
        core.create_namespaced_pod("default", manifest(f"{prefix}-{i}", SCHEDULER, {PROJECT: project}))
    return first, time.time(), time.process_time() - cpu


def _tree(pid: int, apart: set[int]) -> list[int]:
    """The process and its descendants, less those in `apart` (counted on their own) and theirs."""
    out = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            children = [int(c) for c in task.read_text().split()]
        except OSError:
            continue
        for child in children:
            if child not in apart:
                out += _tree(child, apart)
    return out


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU seconds each named process and its live descendants (less the named ones) have used."""
    out = {}
    for name, root in pids.items():
        ticks = 0
        for pid in _tree(root, set(pids.values())):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
        out[name] = ticks / TICK
    return out


@dataclass
class Phase:
    """One burst: its rate, and the CPU seconds each process spent while it ran."""

    pods: int
    seconds: float
    cpu: dict[str, float] = field(default_factory=dict)
    creates_s: float = 0.0
    """How long the creators took to create every pod (answered)."""

    @property
    def rate(self) -> float:
        return self.pods / self.seconds

    def cpu_line(self) -> str:
        total = sum(self.cpu.values())
        parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(self.cpu.items(), key=lambda kv: -kv[1]))
        return f"CPU s over {self.seconds:.1f} s wall ({total / self.seconds:.2f} cores busy): {parts}"


def _run_clients(
    target: Callable[[str, str, int, Any], tuple[float, float, float]],
    clients: int,
    count: int,
    kubeconfig: str,
    prefix: str,
    extra: Any,
) -> tuple[float, float, float]:
    """`clients` processes each run `target` for count // clients pods: (first start, last end, their CPU s)."""
    per = count // clients
    with ProcessPoolExecutor(clients) as pool:
        pool.submit(int).result()
        done = list(pool.map(target, [kubeconfig] * clients, [f"{prefix}{k}" for k in range(clients)],
                             [per] * clients, [extra] * clients))  # fmt: skip
    return min(d[0] for d in done), max(d[1] for d in done), sum(d[2] for d in done)


def ceiling(kubeconfig: str, pids: dict[str, int], count: int, clients: int, nodes: list[str]) -> Phase:
    before = cpu_seconds(pids)
    first, last, client_cpu = _run_clients(_ceiling_client, clients, count, kubeconfig, "ceil", nodes)
    after = cpu_seconds(pids)
    cpu = {k: after[k] - before[k] for k in after if k in before} | {"creators": client_cpu}
    return Phase(count // clients * clients, last - first, cpu, creates_s=last - first)


def clear_ceiling(kubeconfig: str) -> None:
    """Delete the ceiling's pods (they hold GPUs gpupool would see as another scheduler's) and wait for them to go."""
    core = _core(kubeconfig)
    selector = f"{BENCH}=ceiling"
    core.delete_collection_namespaced_pod("default", label_selector=selector, grace_period_seconds=0)
    deadline = time.monotonic() + 120
    while core.list_namespaced_pod("default", label_selector=selector, limit=1).items:
        if time.monotonic() > deadline:
            raise RuntimeError("the ceiling's pods were not deleted in 120 s")
        time.sleep(0.5)


def foreign_burst(
    kubeconfig: str, pids: dict[str, int], count: int, clients: int, project: str, bound: dict[str, float]
) -> Phase:
    """`bound`: pod name → when the watch first saw it bound (filled by another thread)."""
    before = cpu_seconds(pids)
    first, created, client_cpu = _run_clients(_foreign_client, clients, count, kubeconfig, "fp", project)
    per = count // clients
    names = [f"fp{k}-{i}" for k in range(clients) for i in range(per)]
    deadline = time.monotonic() + 900
    while not all(n in bound for n in names) and time.monotonic() < deadline:
        time.sleep(0.1)
    after = cpu_seconds(pids)
    cpu = {k: after[k] - before[k] for k in after if k in before} | {"creators": client_cpu}
    seen = [bound[n] for n in names if n in bound]
    return Phase(len(seen), max(seen) - first, cpu, creates_s=created - first)


def step_seconds(metrics: str) -> dict[str, tuple[float, float]]:
    """gpupool_scheduler_step_seconds from a /metrics text: step → (sum of seconds, count)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(metrics):
        if family.name != "gpupool_scheduler_step_seconds":
            continue
        for s in family.samples:
            kept = out.setdefault(s.labels.get("step", ""), [0.0, 0.0])
            if s.name.endswith("_sum"):
                kept[0] = s.value
            elif s.name.endswith("_count"):
                kept[1] = s.value
    return {k: (v[0], v[1]) for k, v in out.items()}


def step_lines(before: str, after: str, wall_s: float) -> list[str]:
    """The cycle steps' time during the burst, largest first, as a share of the burst's wall time."""
    a, b = step_seconds(before), step_seconds(after)
    spent = {k: (v[0] - a.get(k, (0.0, 0.0))[0], v[1] - a.get(k, (0.0, 0.0))[1]) for k, v in b.items()}
    lines = []
    for step, (secs, n) in sorted(spent.items(), key=lambda kv: -kv[1][0]):
        if n and secs >= 0.005 * wall_s:
            lines.append(f"  {step:14} {secs:6.1f} s ({100 * secs / wall_s:3.0f}% of wall) in {n:.0f} runs, "
                         f"{1000 * secs / n:.0f} ms each")  # fmt: skip
    return lines


@contextmanager
def profiled(pid: int, out: Path, rate: int) -> Iterator[int | None]:
    """Record a py-spy profile (collapsed stacks, `rate` samples a second) of `pid` into `out` while the block runs;
    yields py-spy's pid, or None where py-spy is not in the virtualenv or `rate` is 0."""
    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists() or rate <= 0:
        yield None
        return
    cmd = [str(spy), "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate), "--gil",
           "-o", str(out)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached
    try:
        yield proc.pid
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _is(frame: str, fn: str, where: str) -> bool:
    """Whether a py-spy frame, `Class.function (path/file.py:line)`, is `fn` (any, if empty) in a file at `where`."""
    name, _, place = frame.partition(" (")
    return (not fn or name == fn or name.endswith(f".{fn}")) and where in place


def profile_lines(path: Path, rate: int, top: int = 12) -> list[str]:
    """What the sampled server did while it held the interpreter, by category (CATEGORIES), with the share of it
    in SQLAlchemy. Its CPU seconds less these ran outside the interpreter (OpenSSL, the SQLite engine)."""
    if not path.exists():
        return ["  (py-spy wrote no profile)"]
    samples: Counter[str] = Counter()
    in_store: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        label = next((c for c, fn, where in CATEGORIES for f in frames if _is(f, fn, where)), "other")
        samples[label] += int(count)
        if any("sqlalchemy" in f for f in frames):
            in_store[label] += int(count)
    total = sum(samples.values()) or 1
    lines = [f"  {total / rate:.1f} s holding the interpreter (py-spy --gil, {rate}/s; the stacks are in {path}):"]
    for label, n in samples.most_common(top):
        store = f", {100 * in_store[label] / n:.0f}% of it in SQLAlchemy" if in_store[label] else ""
        lines.append(f"  {label:24} {100 * n / total:4.1f}%{store}")
    return lines
