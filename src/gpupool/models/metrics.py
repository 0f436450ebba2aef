"""A workload's GPU use over time, minute by minute, as the portal's workload page charts it."""

from __future__ import annotations

from gpupool.models.wire import Reply


class MetricsPoint(Reply):
    at: float
    """The minute's start, Unix seconds."""
    gpus: float
    """GPUs held on average over the minute (a fraction for a share of one)."""
    gpu_util_pct: float | None
    """The busy share of what it held, in percent; None where it held no GPU."""
    gpu_memory_mib: int | None
    """The most GPU memory its members used together in a sample of the minute; None before a sample."""


class WorkloadMetrics(Reply):
    workload: str
    project: str
    start: float
    end: float
    points: list[MetricsPoint]
