"""Loaders for public GPU-cluster traces: the Alibaba GPU-sharing trace (FGD, ATC'23) and Philly.

Rows become core types, so whatever the simulator replays goes through the same `schedule()` as the
product. Malformed input raises `TraceError` naming the file, line and column.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gpupool.core import MILLI, Device, Node, Request

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS_SHORT = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_COLUMNS_LONG = (
    *POD_COLUMNS_SHORT,
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)

GPU_MEMORY_MIB = {"P100": 16384, "T4": 15360, "V100M16": 16384, "V100M32": 32768, "A10": 24576}
"""Device memory by model; the trace does not give it and the packing experiment does not use it."""
DEFAULT_GPU_MEMORY_MIB = 32768


class TraceError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Pod:
    """One row of a pod list: a single-member workload of the FGD experiments."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()
    """Allowed GPU models; empty means any."""

    @property
    def gpu_request_milli(self) -> int:
        """Total milli-GPU asked for (what the workload inflation counts)."""
        return self.num_gpu * self.gpu_milli if self.num_gpu else 0

    def request(self) -> Request:
        if self.num_gpu == 0:
            return Request(cpu_milli=self.cpu_milli, memory_mib=self.memory_mib)
        if self.num_gpu == 1 and self.gpu_milli < MILLI:
            return Request(gpu_milli=self.gpu_milli, cpu_milli=self.cpu_milli, memory_mib=self.memory_mib)
        return Request(gpus=self.num_gpu, cpu_milli=self.cpu_milli, memory_mib=self.memory_mib)


def load_nodes(path: Path, pool: str = "default") -> tuple[Node, ...]:
    """A node list (`sn,cpu_milli,memory_mib,gpu,model`); nodes without GPUs are kept as CPU-only nodes."""
    nodes = []
    for line, row in _rows(path, (NODE_COLUMNS,)):
        gpus = _int(path, line, row, "gpu")
        model = row["model"].strip()
        memory = GPU_MEMORY_MIB.get(model, DEFAULT_GPU_MEMORY_MIB)
        devices = tuple(Device(i, model, memory) for i in range(gpus))
        cpu, memory_mib = _int(path, line, row, "cpu_milli"), _int(path, line, row, "memory_mib")
        nodes.append(Node(row["sn"].strip(), pool, cpu, memory_mib, devices))
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return tuple(nodes)


def load_pods(path: Path) -> tuple[Pod, ...]:
    """A pod list in either published layout: 11 columns, or the 5-column `name,cpu_milli,...,gpu_milli`."""
    pods = []
    for line, row in _rows(path, (POD_COLUMNS_LONG, POD_COLUMNS_SHORT)):
        num_gpu = _int(path, line, row, "num_gpu")
        gpu_milli = _int(path, line, row, "gpu_milli")
        if num_gpu and not 0 < gpu_milli <= MILLI:
            raise TraceError(f"{path}:{line}: gpu_milli must be 1..1000 for a GPU pod, got {gpu_milli}")
        if num_gpu > 1 and gpu_milli != MILLI:
            raise TraceError(f"{path}:{line}: a pod of {num_gpu} GPUs must ask for whole GPUs")
        spec = tuple(m for m in (row.get("gpu_spec") or "").split("|") if m)
        pods.append(
            Pod(
                row["name"].strip(),
                _int(path, line, row, "cpu_milli"),
                _int(path, line, row, "memory_mib"),
                num_gpu,
                gpu_milli if num_gpu else 0,
                spec,
            )
        )
    if not pods:
        raise TraceError(f"{path}: no pods")
    return tuple(pods)


@dataclass(frozen=True, slots=True)
class PhillyJob:
    """One job of the Philly trace as packaged by the Pollux artifact."""

    submit_s: float
    """Seconds since the trace's first submission."""
    duration_s: float
    num_gpus: int
    cluster: str
    """The hashed Philly virtual cluster: a team."""


PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")


def load_philly(path: Path) -> tuple[PhillyJob, ...]:
    """`timestamp,duration,num_gpus,gpu_time,cluster`, in submit order (ties by line)."""
    rows = []
    for line, row in _rows(path, (PHILLY_COLUMNS,)):
        try:
            stamp = datetime.strptime(row["timestamp"].strip(), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
            duration = float(row["duration"])
        except ValueError as e:
            raise TraceError(f"{path}:{line}: {e}") from None
        gpus = _int(path, line, row, "num_gpus")
        if duration < 0 or gpus < 1:
            raise TraceError(f"{path}:{line}: a job needs a duration of 0 or more and at least one GPU")
        rows.append((stamp.timestamp(), line, duration, gpus, row["cluster"].strip()))
    if not rows:
        raise TraceError(f"{path}: no jobs")
    rows.sort()
    start = rows[0][0]
    return tuple(PhillyJob(t - start, d, g, c) for t, _, d, g, c in rows)


def _rows(path: Path, layouts: tuple[tuple[str, ...], ...]) -> list[tuple[int, dict[str, str]]]:
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            header = tuple(reader.fieldnames or ())
            if header not in layouts:
                wanted = " or ".join(",".join(layout) for layout in layouts)
                raise TraceError(f"{path}: unexpected header {','.join(header)!r}; expected {wanted}")
            return [(i + 2, row) for i, row in enumerate(reader)]
    except OSError as e:
        raise TraceError(f"{path}: {e.strerror or e}") from e


def _int(path: Path, line: int, row: dict[str, str], column: str) -> int:
    raw = (row.get(column) or "").strip()
    try:
        value = int(raw)
    except ValueError:
        raise TraceError(f"{path}:{line}: column {column} is not an integer: {raw!r}") from None
    if value < 0:
        raise TraceError(f"{path}:{line}: column {column} is negative: {value}")
    return value
