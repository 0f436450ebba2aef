"""Wire models of right-sizing advice and its report. Like schemas.py, they depend on pydantic only (the client and
the CLI import them); the rule that gives the advice is gpupool.services.rightsizing's. They import nothing of
schemas.py, so that schemas.py may import RightsizingAdvice (for WorkloadDetail) without a cycle."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class Reply(BaseModel):
    """As schemas.Reply: an answer is read tolerantly (a newer server may add fields)."""

    model_config = ConfigDict(extra="ignore")


AdviceRule = Literal["share", "gpus"]
"""share: one GPU or less per worker, ask a fraction or its memory; gpus: several whole GPUs per worker, fewer
would do."""


class RightsizingAdvice(Reply):
    rule: AdviceRule
    gpus: int | None = None
    """The whole GPUs per worker to ask for (rule gpus)."""
    gpu: float | None = None
    """The fraction of one GPU to ask for (rule share): `--gpu`."""
    gpu_memory_mib: int | None = None
    """The GPU memory to ask for instead (rule share): `--gpu-memory`."""
    advised_milli: int
    """Milli-GPU per worker that the advised request holds (for a share, the fraction's: the larger of the two)."""
    granted_milli: int
    """Milli-GPU per worker that it holds now."""
    message: str
    """The advice for people: what it used, and the request that would do."""


class RightsizingLine(Reply):
    project: str
    workload: str
    state: str
    request: str
    """What it asks for, as `list` writes it (e.g. "2 GPUs", "0.5 GPU", "2 × 1 GPU")."""
    workers: int
    sampled_minutes: int
    """Minutes of its life with telemetry samples (the advice needs at least the rule's minimum)."""
    peak_gpu_memory_mib: int | None
    """The most GPU memory one worker was seen to use."""
    peak_gpu_util_pct: int | None
    """The highest sampled utilisation of its whole grant."""
    busy_pct: float | None
    """Busy GPU-seconds over allocated GPU-seconds, over its life."""
    gpu_hours: float
    """GPU-hours it held in the period."""
    freed_gpu_hours: float
    """GPU-hours in the period the advised request would not have held."""
    advice: RightsizingAdvice | None


class RightsizingTotal(Reply):
    project: str
    gpu_hours: float
    freed_gpu_hours: float
    advised: int
    """How many of its workloads got advice."""


class RightsizingReport(Reply):
    start: float
    end: float
    project: str | None
    lines: list[RightsizingLine]
    """Every workload that held GPUs in the period: the most GPU-hours freed first."""
    projects: list[RightsizingTotal]
    total: RightsizingTotal
